"""Tensor-parallel decode on torch.distributed: the ranks (ranks.py), how they are started
(launch.py), and the parallel linears and sharded loading that split the model (linear.py)."""
