"""Timing helpers shared by the benchmarks."""
import statistics
import time


def time_per_call(fn, iterations, warmup=2):
    """Median wall time of fn() in milliseconds (fn must block until its work is done)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def report(rows, title):
    """Prints a Markdown table of (name, ms, ratio-to-baseline) rows."""
    print(f"\n### {title}\n")
    print("| measurement | ms per batch | vs. tf_sc_embedding |")
    print("|---|---:|---:|")
    for name, ms, ratio in rows:
        ratio_text = "" if ratio is None else f"{ratio:.1f}x"
        print(f"| {name} | {ms:.1f} | {ratio_text} |")
