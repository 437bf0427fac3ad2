"""The kind codes of gpu_ops rows (frames.py GPU_KINDS holds their names), with no pandas: the Kineto
decode (readers/kineto_columns.py) runs in workers forked before pandas is imported."""

GPU_KIND_NAMES = ("kernel", "memcpy", "memset")
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = range(len(GPU_KIND_NAMES))
