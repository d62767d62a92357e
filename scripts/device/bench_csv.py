"""The project's benchmark CSV layout, shared by the PyTorch anchors (anchor_e2e.py,
anchor_kernels.py) so that their rows read exactly like those of `liger bench`
(examples/src/csv.rs):

    kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date

- numbers: up to 6 decimals with trailing zeros trimmed, empty when not finite (a failed
  measurement), as `csv::number` writes them;
- fields with a comma, a quote or a line break are quoted (RFC 4180), as `csv::field`;
- quantiles: linear interpolation between the sorted samples, as `measure::quantile`;
- a file is appended to, its header written when it is new or empty; a file that starts
  with another header is refused (rows of another layout).
"""
import csv
import datetime
import io
import math
import os
import subprocess

HEADER = "kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date"
COLUMNS = HEADER.split(",")


def number(x):
    """A number field: up to 6 decimals, trailing zeros trimmed; empty when not finite."""
    if x is None or not math.isfinite(x):
        return ""
    s = f"{x:.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("", "-", "-0") else s


def quantile(values, q):
    """The q-quantile of values, linear between the sorted samples (NaN when empty)."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = min(max(q, 0.0), 1.0) * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def p50_20_80(values):
    """[median, 20th, 80th percentile]."""
    return [quantile(values, 0.5), quantile(values, 0.2), quantile(values, 0.8)]


def rate(amount, seconds):
    """[p50, p20, p80] of amount / time from time quantiles [t50, t20, t80]: the 20th
    percentile of a rate is at the 80th of the time."""
    t50, t20, t80 = seconds
    return [amount / t50, amount / t80, amount / t20]


def row(kernel, provider, mode, metric, x, values, config):
    """One row, less the run columns (gpu, commit, date)."""
    p50, p20, p80 = values
    return {
        "kernel": kernel,
        "provider": provider,
        "mode": mode,
        "metric": metric,
        "x": str(x),
        "p50": p50,
        "p20": p20,
        "p80": p80,
        "config": config,
    }


def line(r, run):
    """The CSV line of row r with the run's gpu, commit and date (no line break)."""
    fields = [r["kernel"], r["provider"], r["mode"], r["metric"], r["x"],
              number(r["p50"]), number(r["p20"]), number(r["p80"]), r["config"],
              run["gpu"], run["commit"], run["date"]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(fields)
    return buf.getvalue()


def append(path, rows, run):
    """Appends rows to the CSV at path (header first when new or empty)."""
    existing = ""
    if os.path.exists(path):
        with open(path) as f:
            existing = f.readline()
    if existing and existing.rstrip("\r\n") != HEADER:
        raise SystemExit(
            f"{path} holds CSV rows of another layout (header `{existing.strip()}`, expected "
            f"`{HEADER}`); write to another file")
    with open(path, "a") as f:
        if not existing:
            f.write(HEADER + "\n")
        for r in rows:
            f.write(line(r, run) + "\n")


def utc_date():
    """Today's UTC date, YYYY-MM-DD."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def default_commit():
    """$LIGER_COMMIT, else .gpu/commit (what scripts/gpu_env.sh reads), else the short hash
    of HEAD, else `unknown`."""
    if os.environ.get("LIGER_COMMIT"):
        return os.environ["LIGER_COMMIT"]
    try:
        with open(".gpu/commit") as f:
            c = f.read().strip()
            if c:
                return c
    except OSError:
        pass
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions():
    """`torch=... transformers=... liger_kernel=... triton=...` of what is importable."""
    from importlib import metadata
    out = []
    for name in ("torch", "transformers", "liger_kernel", "triton"):
        try:
            out.append(f"{name}={metadata.version(name.replace('_', '-'))}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}=none")
    return " ".join(out)
