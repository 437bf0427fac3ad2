"""Where replicated strategies keep gradients on the wire: the "had a gradient" flags and the buckets."""
