#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The exe_wrapper of `meson test --setup valgrind`.

Usage: valgrind-wrap.py VALGRIND [OPTION]... -- TEST [ARG]...

Runs TEST under valgrind. A test that is mpirun starting ranks gets valgrind
on each rank instead: mpirun is Open MPI's own program, and its leaks are
not ours. The rank program is mpirun's last argument, as tests/meson.build
passes it.
"""
import os
import sys

args = sys.argv[1:]
split = args.index("--")
valgrind, test = args[:split], args[split + 1:]
if os.path.basename(test[0]) in ("mpirun", "mpiexec", "orterun"):
    command = test[:-1] + valgrind + test[-1:]
else:
    command = valgrind + test
os.execvp(command[0], command)
