"""Kernel export over every transformers architecture that builds from a shrunk config (a script).

    python tests/kernels/census_export.py OUT.jsonl [--mode eval|train] [--only llama,bert] [--chunk 25]

Stands in for ``python -m census`` (branch ``census``) until it lands. For each model type of
transformers' auto mapping: the library's default config, shrunk (:data:`SHRINK`), built with
``AutoModel.from_config`` and run once on token ids with its defaults (caches on); the first layer
of its first layer list and that layer's MLP and attention children are captured, then each capture
is exported (``export_kernelbench``, self-check off: the evaluator below is the check) and run
through KernelBench's evaluator contract (``kernelbench_contract.evaluate``, ``ModelNew = Model``),
which must reproduce the recorded output. One JSON line per architecture; architectures run in
chunks of child processes (a crash or a hang costs one chunk's rest, which is retried one by one).
The summary (``--summary OUT.jsonl``) counts exported / captured, evaluator passes, and failures
by reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHRINK = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2,
    "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128,
    "max_position_embeddings": 128, "n_positions": 128, "d_model": 32, "d_ff": 64, "ffn_dim": 64,
    "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "n_embd": 32, "n_inner": 64, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "embed_dim": 32, "num_heads": 4, "d_kv": 8, "num_decoder_layers": 1, "shared_expert_intermediate_size": 32,
}
LAYER_LISTS = ("layers", "layer", "h", "block", "blocks")
TIMEOUT_S = 240


def _small(config: Any) -> dict[str, int]:
    return {k: v for k, v in SHRINK.items() if isinstance(getattr(config, k, None), int) and not isinstance(getattr(config, k), bool)}


def shrunk_config(model_type: str) -> Any:
    """The library's default config of ``model_type`` with every size in :data:`SHRINK` it has made
    small, built through the config's own ``__init__`` (so derived fields such as ``layer_types``
    follow); sub-configs (``text_config``, ...) are passed as shrunk dicts."""
    import transformers

    base = transformers.AutoConfig.for_model(model_type)
    overrides: dict[str, Any] = dict(_small(base))
    for name in vars(base):
        sub = getattr(base, name, None)
        if name.endswith("_config") and sub is not None and hasattr(sub, "to_dict") and sub is not base:
            data = {k: v for k, v in sub.to_dict().items() if k != "layer_types"}
            overrides[name] = {**data, **_small(sub)}
    return transformers.AutoConfig.for_model(model_type, **overrides)


_MLP = ("mlp", "feed_forward", "feedforward", "ffn", "intermediate", "denserelu", "experts")
_ATTENTION = ("attn", "attention")


def targets(model: Any) -> list[str]:
    """The first layer of the model's first layer list, then its first MLP-like and first
    attention-like descendant (by name or class name, nearest first)."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and name.rpartition(".")[2] in LAYER_LISTS:
            layer = f"{name}.0"
            found = [layer]
            inside = sorted(module[0].named_modules(), key=lambda item: item[0].count("."))
            for words in (_MLP, _ATTENTION):
                for child, sub in inside:
                    label = f"{child.rpartition('.')[2]} {type(sub).__name__}".lower()
                    if child and any(w in label for w in words):
                        found.append(f"{layer}.{child}")
                        break
            return found
    return []


def run_architecture(model_type: str, mode: str, work: Path) -> dict[str, Any]:
    """Build, capture and export one architecture; what happened to each captured module."""
    import torch
    import transformers

    import modulelens
    from modulelens.kernels.export import export_kernelbench

    sys.path.insert(0, str(HERE))
    import kernelbench_contract

    row: dict[str, Any] = {"model_type": model_type, "mode": mode, "modules": []}
    try:
        config = shrunk_config(model_type)
        torch.manual_seed(0)
        with modulelens.track_init():
            model = transformers.AutoModel.from_config(config)
        model.train(mode == "train")
        names = targets(model)
        row["targets"] = names
        if not names:
            row["skipped"] = "no layer list"
            return row
        vocab = int(getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 100))
        ids = torch.randint(3, min(vocab, 100), (2, 7), generator=torch.Generator().manual_seed(3))
        repo = modulelens.Repo(work / "repo")
        kwargs: dict[str, Any] = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
        with modulelens.capture(model, targets=names, repo=repo, name=model_type) as cap:
            model(**kwargs)
        saved = {s.ref: s for s in cap.saved}
    except Exception as error:
        row["skipped"] = f"does not build or run from the shrunk config: {type(error).__name__}: {str(error)[:200]}"
        return row
    for ref in saved:
        entry: dict[str, Any] = {"ref": ref}
        row["modules"].append(entry)
        start = time.perf_counter()
        try:
            result = export_kernelbench(ref, work / "problems" / ref.replace("/", "_").replace(":", "_"), repo=repo,
                                        check=False)
            entry["exported"] = True
            entry["kernelbench_compatible"] = result.manifest["kernelbench_compatible"]
            entry["reasons"] = result.manifest["kernelbench_incompatible_reasons"]
            evaluation = kernelbench_contract.evaluate(result.directory)
            entry["evaluator"] = {"correct": evaluation.correctness, "reproduces": evaluation.reproduces_recorded,
                                  "error": evaluation.error, "notes": evaluation.notes[:2],
                                  "max_diff": evaluation.max_diff_vs_recorded}
        except Exception as error:
            entry["exported"] = False
            entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            if not isinstance(error, modulelens.ModulelensError):
                entry["traceback"] = traceback.format_exc()[-800:]
        entry["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _timed_out(signum: int, frame: Any) -> None:
    raise TimeoutError(f"no result after {TIMEOUT_S} s")


def child(types: list[str], mode: str, out: Path) -> None:
    signal.signal(signal.SIGALRM, _timed_out)
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for model_type in types:
        with tempfile.TemporaryDirectory(prefix="census-export-") as work:
            signal.alarm(TIMEOUT_S)
            try:
                row = run_architecture(model_type, mode, Path(work))
            except BaseException as error:  # the alarm (a hang), anything else: one row says so
                row = {"model_type": model_type, "mode": mode, "modules": [], "skipped": f"crashed: {error!r}"[:300]}
            signal.alarm(0)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def summary(path: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    modules = [m for r in rows for m in r["modules"]]
    exported = [m for m in modules if m.get("exported")]
    evaluated = [m for m in exported if m.get("evaluator")]
    reproduces = [m for m in evaluated if m["evaluator"]["reproduces"]]
    failures = collections.Counter(m["error"].split(":")[0] + ": " + m["error"].split(": ", 1)[-1][:90]
                                   for m in modules if not m.get("exported"))
    not_reproduced = collections.Counter(
        (m["evaluator"].get("error") or "; ".join(m["evaluator"]["notes"]) or "values differ")[:100]
        for m in evaluated if not m["evaluator"]["reproduces"])
    return {"architectures": len(rows), "built": sum(1 for r in rows if not r.get("skipped")),
            "captured": len(modules), "exported": len(exported),
            "export_rate": round(len(exported) / len(modules), 4) if modules else None,
            "kernelbench_compatible": sum(1 for m in exported if m["kernelbench_compatible"]),
            "evaluator_reproduces": len(reproduces),
            "evaluator_reproduces_compatible": sum(1 for m in reproduces if m["kernelbench_compatible"]),
            "export_failures": failures.most_common(), "not_reproduced": not_reproduced.most_common(),
            "skipped": collections.Counter(r["skipped"][:70] for r in rows if r.get("skipped")).most_common(12)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", default="eval", choices=("eval", "train"))
    parser.add_argument("--only", default=None)
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--summary", action="store_true")
    args, rest = parser.parse_known_args()
    if args.summary:
        print(json.dumps(summary(args.out), indent=1))
        return
    if args.child:
        child(rest, args.mode, args.out)
        return
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    done = {json.loads(line)["model_type"] for line in args.out.read_text().splitlines()} if args.out.exists() else set()
    wanted = args.only.split(",") if args.only else sorted(MODEL_MAPPING_NAMES)
    todo = [t for t in wanted if t not in done]
    for i in range(0, len(todo), args.chunk):
        chunk = todo[i:i + args.chunk]
        subprocess.run([sys.executable, __file__, str(args.out), "--child", "--mode", args.mode, *chunk],
                       timeout=TIMEOUT_S * len(chunk) + 60, check=False)
        finished = {json.loads(line)["model_type"] for line in args.out.read_text().splitlines()} if args.out.exists() else set()
        for model_type in chunk:  # a chunk that died: the rest one at a time
            if model_type not in finished:
                run = subprocess.run([sys.executable, __file__, str(args.out), "--child", "--mode", args.mode, model_type],
                                     timeout=TIMEOUT_S + 60, check=False)
                if run.returncode != 0:
                    with open(args.out, "a") as f:
                        f.write(json.dumps({"model_type": model_type, "mode": args.mode, "modules": [],
                                            "skipped": f"crashed: the process exited with {run.returncode}"}) + "\n")
    print(json.dumps(summary(args.out), indent=1))


if __name__ == "__main__":
    main()
