#!/usr/bin/env python3
"""A stand-in for the nsys CLI that records what it was asked, for tests of the file handling.

profile: runs the program; writes the --output report only when the program exits 0 and
FAKE_NSYS_NO_REPORT is unset; with FAKE_NSYS_START_FAILS_ONCE=FLAGFILE the first call fails
the way nsys 2022.4 sometimes does when other sessions run (sem_open); with
FAKE_NSYS_HANG_PIDFILE=FILE it writes its pid there and hangs. export: writes a minimal nsys-like SQLite file, or, with
FAKE_NSYS_EXPORT_FAIL set, half a file and exit 1.
"""
import sqlite3
import subprocess
import sys


def opt(args, name):
    return args[args.index(name) + 1]


def main(args):
    import os
    if args[:1] == ["--version"]:
        print("NVIDIA Nsight Systems version 2099.1.0-fake")
        return 0
    if args[0] == "profile":
        out = opt(args, "--output")
        program = args[args.index("--output") + 2:]
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
            print("Dynamic exception type: boost::wrapexcept<boost::interprocess::interprocess_exception>")
            print("[boost::errinfo_api_function_*] = sem_open")
            return 1
        print("Capture range started in the application.")
        rc = subprocess.call(program)
        print("[1/1] [=====100%] x.nsys-rep")
        if rc == 0 and not os.environ.get("FAKE_NSYS_NO_REPORT"):
            with open(out, "w") as f:
                f.write("fake report")
        return rc
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
