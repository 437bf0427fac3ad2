"""The communication layer: collectives, point-to-point all-reduces, in-flight tracking, timing."""
