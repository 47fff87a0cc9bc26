"""``linvit models``: list linvit's registered timm models with their size (and MACs, and the README table)."""

from __future__ import annotations

import argparse
import fnmatch
import re

HELP = (
    "List linvit's models (timm names) with parameters; --macs adds MACs at 224 and 1024, --markdown the README table."
)

MAC_SIZES = (224, 1024)
# "82.1% ImageNet-1k top-1" or "ImageNet-1k top-1 82.1" / "top-1: 82.1%"
_TOP1 = re.compile(r"(\d{2}\.\d+)\s*%[^%;()]*?top-1|top-1\s*(?:accuracy)?\s*[:=]?\s*(\d{2}\.\d+)", re.IGNORECASE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pattern", default="*", help="fnmatch pattern on the model name, e.g. 'flatten_swin*'")
    parser.add_argument("--macs", action="store_true", help="also count MACs at 224x224 and 1024x1024 (slower)")
    parser.add_argument(
        "--markdown", action="store_true", help="print the README table: params, MACs at 224/1024, published top-1"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr (one line per model)")


def linvit_model_names(pattern: str = "*") -> list[str]:
    """Every timm model registered by a linvit module, optionally filtered by an fnmatch pattern."""
    import timm
    from timm.models import model_entrypoint

    import linvit.models  # noqa: F401  (registers the families)

    names = []
    for name in timm.list_models():
        module = getattr(model_entrypoint(name), "__module__", "") or ""
        if module.startswith("linvit.") and fnmatch.fnmatch(name, pattern):
            names.append(name)
    return names


def published_top1(name: str) -> float | None:
    """ImageNet-1k top-1 (%) published for the model, as its family states it in the pretrained cfg or docstring.

    Looks for "NN.N% ... top-1" in the cfg's ``notes``/``description``, then in the model function's docstring;
    None when the family states none (e.g. linvit's own models, which have no trained weights yet).
    """
    import timm
    from timm.models import model_entrypoint

    cfg = timm.get_pretrained_cfg(name, allow_unregistered=True)
    texts = []
    if cfg is not None:
        texts += list(cfg.notes or ()) + [cfg.description or ""]
    texts.append(model_entrypoint(name).__doc__ or "")
    return top1_in_texts(texts)


def top1_in_texts(texts: list[str]) -> float | None:
    """The first "NN.N% ... top-1" figure in ``texts`` (a comparison such as "(Swin-T 81.3)" after it is ignored)."""
    for text in texts:
        match = _TOP1.search(text)
        if match:
            return float(match.group(1) or match.group(2))
    return None


def model_macs(name: str, sizes: tuple[int, ...] = MAC_SIZES) -> list[int]:
    """MACs of one forward per image at each square size, on fake tensors (no memory, no real compute)."""
    import timm
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from linvit.utils import macs_counter

    results = []
    # built on meta (no init compute), then moved to fake CPU tensors: they carry shapes and report the CPU device,
    # so the flop counter sees every product at 1024x1024 without running it (autocast guards reject device 'meta')
    model = timm.create_model(name, device="meta").eval()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cpu")
        in_chans = model.pretrained_cfg.get("input_size", (3,))[0]
        for size in sizes:
            x = torch.empty(1, in_chans, size, size)
            with torch.no_grad(), macs_counter() as counter:
                model(x)
            results.append(counter.get_total_flops() // 2)
    return results


def model_params(name: str) -> int:
    import timm

    model = timm.create_model(name, device="meta")
    return sum(p.numel() for p in model.parameters())


def _fmt_macs(macs: int | None) -> str:
    return "n/a" if macs is None else f"{macs / 1e9:.2f}"


def run(args: argparse.Namespace) -> int:
    from linvit.utils.progress import Progress

    names = linvit_model_names(args.pattern)
    if not names:
        print(f"no linvit model matches {args.pattern!r}")
        return 1
    with_macs = args.macs or args.markdown
    rows = []
    for name in Progress("models", enabled=not args.no_progress).items(names):
        macs: list[int | None] = [None] * len(MAC_SIZES)
        if with_macs:
            try:
                macs = list(model_macs(name))
            except Exception as error:  # report and go on: one broken count must not hide the others
                print(f"# {name}: MACs could not be counted ({type(error).__name__}: {error})")
        rows.append((name, model_params(name), macs, published_top1(name)))

    if args.markdown:
        print("| model | params (M) | GMACs @224 | GMACs @1024 | ImageNet-1k top-1 (published) |")
        print("|---|---:|---:|---:|---:|")
        for name, params, macs, top1 in rows:
            top1_text = f"{top1:.1f}" if top1 is not None else "—"
            print(f"| `{name}` | {params / 1e6:.1f} | {_fmt_macs(macs[0])} | {_fmt_macs(macs[1])} | {top1_text} |")
        return 0

    header = f"{'model':40s} {'params (M)':>10s}"
    if with_macs:
        header += "".join(f" {f'GMACs@{s}':>12s}" for s in MAC_SIZES)
    print(header)
    for name, params, macs, _ in rows:
        line = f"{name:40s} {params / 1e6:10.2f}"
        if with_macs:
            line += "".join(f" {_fmt_macs(m):>12s}" for m in macs)
        print(line)
    return 0
