#!/usr/bin/env python3
"""Splits each of the committer's fdatasyncs into the block requests it waited for.

Input: `perf script -F comm,tid,cpu,time,event,trace` of a run recorded with

    perf record -a -e block:block_rq_issue,block:block_rq_complete \
        -e syscalls:sys_enter_fdatasync,syscalls:sys_exit_fdatasync \
        -- tandem-bench register --no-floors --secs 3 --concurrency 64

Usage: wal_trace.py [FROM TO] < script.txt   (FROM, TO: perf timestamps of the window, such
as the step at half of saturation; `--rate` prints the fdatasyncs per 0.25 s to find it).

Per fdatasync of a `tandem-committer` thread (its WAL), in ms: the time to the data's issue,
the data (and the inode table's block, `WSM`, when the filesystem writes it) on the disk, the
wait from the last data completion to the cache flush's issue (`FF`, issued by the block
layer's worker thread on the CPU the committer runs on), the flush on the disk, and the
wait from its completion to the return; and the share of fdatasyncs that wrote the inode's
block. Used in docs/benchmarks.md, "Issue 21, twenty-seventh round".
"""
import bisect
import collections
import re
import statistics
import sys

LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    args = [a for a in sys.argv[1:] if a != "--rate"]
    lo, hi = (float(args[0]), float(args[1])) if len(args) == 2 else (0.0, float("inf"))
    pending, flushes, reqs, syncs, cur = {}, [], [], [], None
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        comm, _tid, _cpu, t, ev, tr = m.groups()
        t, f = float(t), tr.split()
        if ev == "block:block_rq_issue":
            if f[1] == "FF":
                flushes.append((t, comm))
            else:
                pending[(f[1], f[4])] = t
        elif ev == "block:block_rq_complete":
            if f[1] == "FF":
                if flushes:  # one flush in flight at a time: the latest issue is this one's
                    issued, _ = flushes.pop()
                    flushes.clear()
                    reqs.append((issued, t, "FF"))
            elif (f[1], f[3]) in pending:
                reqs.append((pending.pop((f[1], f[3])), t, f[1]))
        elif comm.startswith("tandem-committe"):
            if ev == "syscalls:sys_enter_fdatasync":
                cur = t
            elif ev == "syscalls:sys_exit_fdatasync" and cur is not None:
                syncs.append((cur, t))
                cur = None
    if "--rate" in sys.argv:
        rate = collections.Counter(int(e * 4) / 4 for e, _ in syncs)
        print(" ".join(f"{k:.2f}:{v}" for k, v in sorted(rate.items())))
        return
    reqs.sort()
    starts = [r[0] for r in reqs]
    out = collections.defaultdict(list)
    for enter, exit_ in syncs:
        if not lo <= enter <= hi:
            continue
        i = bisect.bisect_left(starts, enter)
        mine = []
        while i < len(reqs) and reqs[i][0] <= exit_:
            if reqs[i][1] <= exit_ + 1e-6:
                mine.append(reqs[i])
            i += 1
        data = [r for r in mine if r[2] != "FF"]
        flush = [r for r in mine if r[2] == "FF"]
        out["fdatasync"].append((exit_ - enter) * 1e3)
        if not data or not flush:
            continue
        ff = flush[-1]
        before = [r[1] for r in data if r[1] <= ff[0] + 1e-6]
        out["to the data's issue"].append((data[0][0] - enter) * 1e3)
        out["data (+ inode) on disk"].append(sum(r[1] - r[0] for r in data) * 1e3)
        if before:
            out["to the flush's issue"].append((ff[0] - max(before)) * 1e3)
        out["flush on disk"].append((ff[1] - ff[0]) * 1e3)
        out["to the return"].append((exit_ - ff[1]) * 1e3)
        out["wsm"].append(any(r[2] == "WSM" for r in data))
    for k, xs in out.items():
        if k != "wsm" and xs:
            print(f"{k:24} n={len(xs):6}  p50 {pct(xs, 50):.3f}  p90 {pct(xs, 90):.3f}  "
                  f"p99 {pct(xs, 99):.3f}  mean {statistics.mean(xs):.3f}")
    if out["wsm"]:
        print(f"inode block written in {100 * sum(out['wsm']) / len(out['wsm']):.0f}% of fdatasyncs")


if __name__ == "__main__":
    main()
