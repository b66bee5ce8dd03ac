"""The weight path: how a trained policy reaches the rollout engines, in one package.

- ``wire.py``: the format every transfer shares (tensor specs, the JSON header, buckets).
- ``protocols.py``: what a strategy implements (a bucket sender) and what it needs of the
  process group (the sync group's point-to-point sends).
- ``p2p.py``: the header and the buckets point to point from the trainer leader to each
  rollout driver over the run's process group (gloo on CPU); the header of every transfer
  travels this way.
- ``nccl.py``: the buckets over NCCL straight into the vLLM engines' workers (CUDA).
- ``send.py``: the trainer's side: the model's tensors under checkpoint names, gathered a
  bucket at a time and handed to the strategy's sender.

Nothing here imports an engine's package: the engines import this one.
"""
