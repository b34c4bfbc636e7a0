"""The benchmark's reward (bench_workload.BenchTask.reward) as verl's custom reward function: a hash of the
response, so rewards vary within each group and advantages are not all zero."""

import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    return zlib.crc32(f"{ground_truth}{solution_str}".encode()) % 1000 / 1000
