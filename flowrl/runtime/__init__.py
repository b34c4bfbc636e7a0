"""The runtime layer: executors, role factories, the training loop, checkpoints.

Ray is optional: flowrl.runtime.ray.executor imports it and is imported only when asked for.
"""
