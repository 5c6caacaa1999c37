"""Make a real report, its HTML page and a screenshot of the page.

    PYTHONPATH=python-shim python3 docs/example_report.py [--out-dir DIR] [--screenshot docs/report.png]

On this machine's CPU: `understudy calibrate` measures the host's copy
bandwidth and matrix rates into a profile, then the demo's decoder
(understudy.demo) generates tokens twice under understudy with that profile:
every operator definition observed (a call in 4 timed) and scored, the model's RMSNorm through
_C::rms_norm with the native rms_norm candidate under the promotion policy
(shadow -> canary -> live), and a SiLU candidate served live that goes wrong
after 40 runs (rolled back at its first verified mismatch). The report is
written to DIR/example-report.json, the page to DIR/example-report.html
(`understudy html`), and with --screenshot headless Chromium draws the page
into a PNG (network off: the page needs none)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def make_report(out_dir: pathlib.Path, tokens: int) -> pathlib.Path:
    import understudy
    from understudy import demo
    from understudy.calibrate import calibrate

    hw = out_dir / "hardware"
    hw.mkdir(exist_ok=True)
    prof = calibrate(device="cpu")
    (hw / "host.json").write_text(json.dumps(prof, indent=1))
    path = out_dir / "example-report.json"
    config, notes = demo.rollout_config("cpu", str(path))
    # every operator definition observed (an operator not listed is not intercepted), a call in 4 timed
    ops = {d.stem: "observe" for d in sorted((ROOT / "problems").glob("*.json"))}
    config["operators"] = dict(ops, **config["operators"])
    config["defaults"] = {"mode": "observe", "sample": 0.25}
    config["hardware"] = {"dir": str(hw), "profile": prof["name"]}
    name, generate, vocab, model = demo.build_model("cpu", prefer_hf=False)
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    generate(ids, tokens)  # warm-up outside understudy
    demo._phase(model, f"{name}, profile {prof['name']}:", config, notes,
                lambda: [generate(ids, tokens) for _ in range(2)])
    return path


def screenshot(html: pathlib.Path, png: pathlib.Path, width: int = 1280, height: int = 2400) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install chromium)")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-background-networking", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
               f"--user-data-dir={profile}", f"--window-size={width},{height}", "--force-device-scale-factor=1",
               f"--screenshot={png.resolve()}", html.resolve().as_uri()]
        if os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=".", help="where the report and its page are written")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--screenshot", default=None, help="a PNG of the page, drawn by headless Chromium")
    args = ap.parse_args()
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep = make_report(out, args.tokens)
    from understudy.html import main as html_main

    html = out / "example-report.html"
    if html_main(str(rep), str(html)) != 0:
        return 1
    if args.screenshot:
        screenshot(html, pathlib.Path(args.screenshot))
        print(f"screenshot: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
