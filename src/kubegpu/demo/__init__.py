"""A GPU node without a GPU: the simulated node (`simnode`: the kubelet simulator in-process, `kubegpu
plugin` as a child process on the fake NVML) and `kubegpu demo` (`run`), which narrates it.

The contract tests and the benchmarks build on `simnode` too. May import `kubeletsim`, `node`,
`allocation`; reaches the plugin only as a process.
"""
