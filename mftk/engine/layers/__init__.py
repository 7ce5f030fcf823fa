"""Building blocks of the PyNative models, written with ops that have CPU kernels (mindspore-cpu.md §10)."""
