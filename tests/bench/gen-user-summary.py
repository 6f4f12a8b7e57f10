#!/usr/bin/env python3
"""Writes N rows of the seed table user_summary(user_id, weight, level, beat_rate, level_num) as
LOAD DATA INFILE text (TSV) to stdout, sorted by user_id (`shuffle` as 2nd argument: shuffled)."""
import sys, random
n = int(sys.argv[1]); shuffled = len(sys.argv) > 2 and sys.argv[2] == "shuffle"
levels = ["Bronze I","Silver II","Gold III","Platinum IV","Diamond V","Master"]
ids = list(range(13000000000, 13000000000 + n * 3, 3))
if shuffled: random.Random(7).shuffle(ids)
out = sys.stdout
buf = []
for uid in ids:
    h = (uid * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    buf.append(f"{uid}\t{40 + h % 80}.{h % 10}\t{levels[(h >> 8) % 6]}\t{(h >> 16) % 100}.{(h >> 24) % 100:02d}%\t{(h >> 32) % 1000}\n")
    if len(buf) >= 100000:
        out.write("".join(buf)); buf = []
out.write("".join(buf))
