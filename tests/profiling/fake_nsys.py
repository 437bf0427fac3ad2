#!/usr/bin/env python3
"""A stand-in for the nsys CLI that records what it was asked, for tests of the file handling.

profile: runs the program (with FAKE_NSYS_SKIP_PROGRAM set, only as if it had exited 0: for tests of
what is run around it, which need no training ranks); writes the --output report only when the program
exits 0 and FAKE_NSYS_NO_REPORT is unset; with FAKE_NSYS_START_FAILS_ONCE=FLAGFILE the first call fails
the way nsys 2022.4 sometimes does when other sessions run (sem_open; "End of file" with
FAKE_NSYS_START_FAILURE=eof); with
FAKE_NSYS_HANG_PIDFILE=FILE it writes its pid there and hangs. export: writes a minimal nsys-like SQLite file, or, with
FAKE_NSYS_EXPORT_FAIL set, half a file and exit 1. With FAKE_NSYS_LOG=FILE every call but --version
appends a JSON line to FILE: its argv and the NSYS_NVTX_PROFILER_REGISTER_ONLY and DDP_PROFILER it was given.

The import step, as real nsys does it: the report is written as a raw capture X.qdstrm first, then
turned into X.nsys-rep by the importer. With FAKE_NSYS_IMPORT_FAIL set the import fails (the .qdstrm
stays, nsys's message is printed, exit 0, like nsys 2025.3); with FAKE_NSYS_SELF=PATH (the wrapper's
path, symlinks resolved, as /proc/self/exe gives nsys) the import runs PATH/../../host-linux-x64/QdstrmImporter
and fails when it is absent.
`-i X.qdstrm` (called as QdstrmImporter): writes X.nsys-rep; with FAKE_IMPORTER_FAIL, fails like an
importer missing a shared library.
"""

import sqlite3
import subprocess
import sys


def opt(args, name):
    return args[args.index(name) + 1]


def import_capture(capture):
    """nsys's import step: True when the report was made from `capture`."""
    import os

    if os.environ.get("FAKE_NSYS_IMPORT_FAIL"):
        return False
    me = os.environ.get("FAKE_NSYS_SELF")
    if me:  # real nsys runs ../host-linux-x64/QdstrmImporter of its own real folder
        importer = os.path.join(os.path.dirname(os.path.dirname(me)), "host-linux-x64", "QdstrmImporter")
        if not os.access(importer, os.X_OK):
            return False
        return subprocess.call([importer, "-i", capture]) == 0
    with open(capture[: -len(".qdstrm")] + ".nsys-rep", "w") as f:
        f.write("fake report")
    return True


def main(args):
    import os

    if args[:1] == ["--version"]:
        print("NVIDIA Nsight Systems version 2099.1.0-fake")
        return 0
    log = os.environ.get("FAKE_NSYS_LOG")
    if log:
        import json

        names = ("NSYS_NVTX_PROFILER_REGISTER_ONLY", "DDP_PROFILER")
        with open(log, "a") as f:
            f.write(json.dumps({"argv": args, "env": {k: os.environ[k] for k in names if k in os.environ}}) + "\n")
    if args[0] == "profile":
        out = opt(args, "--output")
        program = args[args.index("--output") + 2 :]
        pidfile = os.environ.get("FAKE_NSYS_HANG_PIDFILE")
        if pidfile:  # a run that never ends: write our pid, leave a partial report, wait forever
            with open(out, "w") as f:
                f.write("partial")
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            import time

            while True:
                time.sleep(1)
        once = os.environ.get("FAKE_NSYS_START_FAILS_ONCE")
        if once and not os.path.exists(once):
            open(once, "w").close()
            if os.environ.get("FAKE_NSYS_START_FAILURE") == "eof":  # the session's channel closed
                print("End of file")
            else:
                print("Dynamic exception type: boost::wrapexcept<boost::interprocess::interprocess_exception>")
                print("[boost::errinfo_api_function_*] = sem_open")
            return 1
        print("Capture range started in the application.")
        rc = 0 if os.environ.get("FAKE_NSYS_SKIP_PROGRAM") else subprocess.call(program)
        print("[1/1] [=====100%] x.nsys-rep")
        if rc == 0 and not os.environ.get("FAKE_NSYS_NO_REPORT"):
            capture = (out[: -len(".nsys-rep")] if out.endswith(".nsys-rep") else out) + ".qdstrm"
            with open(capture, "w") as f:
                f.write("fake capture")
            if not import_capture(capture):
                print("Importer error status: An unknown error occurred.")
                print(f"Generated:\n    {capture}")
                return 0
            os.remove(capture)
        return rc
    if args[0] == "-i":  # QdstrmImporter
        if os.environ.get("FAKE_IMPORTER_FAIL"):
            print(
                "QdstrmImporter: error while loading shared libraries: libdw.so.1: cannot open shared "
                "object file: No such file or directory",
                file=sys.stderr,
            )
            return 127
        with open(args[1][: -len(".qdstrm")] + ".nsys-rep", "w") as f:
            f.write("fake report")
        return 0
    if args[0] == "export":
        out = opt(args, "--output")
        if os.environ.get("FAKE_NSYS_EXPORT_FAIL"):
            with open(out, "w") as f:
                f.write("SQLite format 3\0 truncated")
            print("export failed: disk full", file=sys.stderr)
            return 1
        con = sqlite3.connect(out)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.commit()
        con.close()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
