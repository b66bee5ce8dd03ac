"""Rank 0's logic, pure Python with an injected clock.

The coordinator, the data plane (dispatcher, replay buffer, policy version), samplers and
the generation scheduler and allocator (``scheduling/``). No sockets, no files: the
ZeroMQ edge is :mod:`runtime.rank.control_server`.
"""
