"""The control plane on the wire: typed messages, frames, CURVE keys and the ZeroMQ server."""
