"""Tensor-parallel ranks on torch.distributed: starting them through its elastic launcher
(launch.py) and the process group they join and share (ranks.py). How the model is split is
`graphrt.model.sharding`."""
