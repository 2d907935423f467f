#!/usr/bin/python3
"""OpenMP's team in a new thread (docs/benchmarks.md, "Segmented ops ran on every core").

After torch.set_num_threads(1), times 20 products of two 1024 x 1024 matrices on the main thread,
on a new thread, and on a new thread that sets its count first, printing wall and CPU time: a
new thread's BLAS calls use OpenMP's default team (every core) unless the thread sets it.

Usage: /usr/bin/python3 bench/thread_team.py
"""
import resource
import threading
import time

import torch


def run(tag, a):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    for _ in range(20):
        a @ a
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{tag:<28} wall {time.time() - t0:.3f} s, cpu {cpu:.3f} s")


def main():
    torch.set_num_threads(1)
    a = torch.randn(1024, 1024)
    run("main thread", a)
    for tag, fix in (("new thread", False), ("new thread, count set", True)):
        def body(tag=tag, fix=fix):
            if fix:
                torch.set_num_threads(1)
            run(tag, a)
        t = threading.Thread(target=body)
        t.start()
        t.join()


if __name__ == "__main__":
    main()
