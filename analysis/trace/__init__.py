"""The trace core: a trace file read into typed frames (`frames.Trace`, the same for nsys SQLite and
torch.profiler JSON), the name patterns that say what a kernel or range is, and what a trace says about its
run (its setup and the design notes it calls for; steps and phases from markers). readers/ holds one reader
per format."""
