#!/usr/bin/env python3
"""The runtime's fault matrix: how long until every process of a `sluice train` job has exited
after a rank fails, and what the survivors say.

Cells: {kill, stop, hang, exit} x {rank 0 (it serves the store), a middle rank, the last rank}
x {pp 2, dp 2 x pp 2}, the store host hit by an outside signal (SIGKILL / SIGSTOP / SIGTERM sent
to rank 0's process, which serves the store), and a missing rank (rank 0 missing, the last rank
missing). A fault is injected with `--fault RANK:2:KIND`; the clock starts at the victim's
"injecting fault" line (or when the outside signal is sent; for a missing rank, when the
present ranks start) and stops when the `--nproc` launcher has reaped every rank (every process
exited; a missing-rank job is the present processes, started without a launcher).

Usage: bench/fault_matrix.py SLUICE [--timeout S] [--out FILE.md] [--check] [--only SUBSTR]
  --check: exit 1 unless every cell exits non-zero within timeout + 5 s and its message names the
  failed rank (the `slow` ctest fault_matrix_test runs this).
Prints a Markdown table (docs/runtime.md, "Fault matrix").
"""
import argparse
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

COMMON = ["--model", "gpt-tiny", "--data", "mixture-4task", "--tokens-per-batch", "600",
          "--max-seqlen", "96", "--memory-limit", "55", "--iterations", "40", "--threads", "1",
          "--schedule", "1f1b"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"RANK="):
                    return int(kv[5:])
    except OSError:
        pass
    return None


def run_job(cmd, env, start_marker, action=None, limit=120):
    """Runs `cmd`, returns (rc, seconds from the marker to exit, output lines)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, t0, buf = [], None, b""
    begin = time.monotonic()
    acted = False
    os.set_blocking(p.stdout.fileno(), False)
    while True:
        r, _, _ = select.select([p.stdout], [], [], 0.05)
        if r:
            chunk = p.stdout.read()
            if chunk:
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    lines.append(text)
                    if t0 is None and start_marker and re.search(start_marker, text):
                        if action is None:
                            t0 = time.monotonic()
                        elif not acted:
                            acted = True
                            t0 = action(p.pid)
        if p.poll() is not None:
            rest = p.stdout.read() or b""
            lines += (buf + rest).decode(errors="replace").splitlines()
            break
        if time.monotonic() - begin > limit:
            p.kill()
            p.wait()
            lines.append("(killed by the matrix script: over its limit)")
            break
    end = time.monotonic()
    if t0 is None and start_marker is None:
        t0 = begin
    return p.returncode, (end - t0) if t0 is not None else None, lines


def message(lines, victim):
    """The survivors' account: the first watchdog/rendezvous line of another rank."""
    pat = re.compile(r"sluice: (error: )?rank (\d+): (.*)")
    for l in lines:
        m = pat.search(l)
        if m and "injecting fault" not in l and int(m.group(2)) != victim:
            return l.strip()
    for l in lines:
        if "sluice: error:" in l:
            return l.strip()
    return "(no message)"


def signal_rank0(sig):
    def act(launcher_pid):
        for c in children(launcher_pid):
            if rank_of(c) == 0:
                t = time.monotonic()
                os.kill(c, sig)
                return t
        return time.monotonic()
    return act


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sluice")
    ap.add_argument("--timeout", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    T = a.timeout
    base_env = dict(os.environ)
    rows = []
    configs = [("pp 2", "pp=2", 2), ("dp 2 x pp 2", "dp=2,pp=2", 4)]
    for cname, par, n in configs:
        victims = [("rank 0 (store host)", 0)]
        if n > 2:
            victims.append((f"middle rank ({n // 2})", n // 2))
        victims.append((f"last rank ({n - 1})", n - 1))
        for vname, v in victims:
            for kind in ["kill", "stop", "hang", "exit"]:
                rows.append((cname, vname, kind, v, par, n, "fault"))
        for kind, sig in [("SIGKILL", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP),
                          ("SIGTERM", signal.SIGTERM)]:
            rows.append((cname, "store host, outside signal", kind, 0, par, n, sig))
        rows.append((cname, "missing rank 0", "never started", 0, par, n, "missing"))
        rows.append((cname, f"missing last rank ({n - 1})", "never started", n - 1, par, n,
                     "missing"))
    results, bad = [], 0
    for cname, vname, kind, v, par, n, how in rows:
        label = f"{cname} | {vname} | {kind}"
        if a.only and a.only not in label:
            continue
        env = dict(base_env)
        env["MASTER_PORT"] = str(free_port())
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        args = [a.sluice, "train", "--parallel", par, "--timeout", str(T)] + COMMON
        if how == "fault":
            rc, secs, lines = run_job(args + ["--nproc", str(n), "--fault", f"{v}:2:{kind}"],
                                      env, r"injecting fault")
        elif how == "missing":
            procs = []
            t0 = time.monotonic()
            for r in range(n):
                if r == v:
                    continue
                e = dict(env, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r))
                procs.append(subprocess.Popen(args, env=e, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT))
            outs, rcs = [], []
            for p in procs:
                try:
                    o, _ = p.communicate(timeout=T * 3 + 60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    o, _ = p.communicate()
                outs += o.decode(errors="replace").splitlines()
                rcs.append(p.returncode)
            secs = time.monotonic() - t0
            lines = outs
            rc = min(rcs) if all(x != 0 for x in rcs) else 0
        else:
            rc, secs, lines = run_job(args + ["--nproc", str(n)], env, r"^iter +1 ",
                                      action=signal_rank0(how))
        msg = message(lines, v if how != "missing" else -1)
        names = f"rank {v}" in msg
        ok = rc != 0 and secs is not None and secs <= T + 5 and names
        bad += 0 if ok else 1
        results.append((cname, vname, kind, rc, secs, msg, ok))
        print(f"{'ok  ' if ok else 'FAIL'} {label}: exit {rc}, "
              f"{'?' if secs is None else f'{secs:.1f}'} s: {msg}", flush=True)
        if not ok:
            print("\n".join(lines[-15:]), flush=True)
    table = [f"| config | failed | fault | exit | s to all exited (≤ {T + 5}) | message (first other "
             "rank) |", "|---|---|---|---|---|---|"]
    for cname, vname, kind, rc, secs, msg, ok in results:
        msg = re.sub(r"\(pid \d+\)", "(pid …)", msg).replace("|", "\\|")
        if len(msg) > 230:
            msg = msg[:227] + "…"
        table.append(f"| {cname} | {vname} | {kind} | {rc} | "
                     f"{'?' if secs is None else f'{secs:.1f}'}{'' if ok else ' FAIL'} | {msg} |")
    text = "\n".join(table) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.check and bad:
        print(f"{bad} cell(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
