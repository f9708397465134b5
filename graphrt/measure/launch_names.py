"""Which CUDA (and HIP) API calls launch work on the GPU, by name: without torch, so that reading
a trace back needs none."""

from __future__ import annotations

GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
# Any other launch: cudaLaunchKernel(ExC), cudaLaunchCooperativeKernel, cudaLaunchHostFunc, the
# driver's cuLaunchKernel(Ex), HIP's hipLaunchKernel, hipModuleLaunchKernel,
# hipExtModuleLaunchKernel, ...
KERNEL_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "hipLaunch", "hipModuleLaunch", "hipExtModuleLaunch",
                          "hipExtLaunch")


def launch_kind(api_name: str) -> str | None:
    """"graph" for cudaGraphLaunch* (and HIP's), "kernel" for the other launch APIs, None for the
    rest.

    The one definition of a launch call, for `graphrt run`'s count and `graphrt analyze`'s."""
    if api_name.startswith(GRAPH_LAUNCH_APIS):
        return "graph"
    if api_name.startswith(KERNEL_LAUNCH_PREFIXES):
        return "kernel"
    return None
