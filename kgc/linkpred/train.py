"""Training a link predictor: setup → epochs of contrastive steps → validation → best checkpoint.

Resumable: ``checkpoints/last.pt`` (written atomically every ``train.checkpoint_every`` steps and at
each epoch end) holds model, loss (τ and the pre-batch queue), optimiser, schedule, RNG states and the
step count. The epoch order is a pure function of (seed, epoch), so a resumed run replays the same
batches from the same step with the same schedule.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from kgc.data.graph import load_graph
from kgc.errors import KGCError
from kgc.fileio import write_json, write_text
from kgc.linkpred.evaluate import evaluate
from kgc.linkpred.loss import SimKGCLoss
from kgc.linkpred.model import Run, build_model, save_backbone_files, setup_layer_cache
from kgc.encoding.backbone import resolve_backbone
from kgc.recipe import Recipe, load_recipe
from kgc.training.common import (MetricsLog, autocast, linear_schedule, load_checkpoint, make_optimizer,
                                 pick_device, plot_curves, rng_state, save_checkpoint, seed_everything,
                                 set_rng_state)


def default_run_dir(recipe: Recipe) -> Path:
    return Path("runs") / f"{recipe.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _prepare_new_run(recipe: Recipe, out: Path | None) -> Path:
    run_dir = Path(out) if out else default_run_dir(recipe)
    if (run_dir / "recipe.yaml").exists():
        raise KGCError(f"{run_dir} already holds a run. Continue it with `kgc train --resume {run_dir}` "
                       "or pick another --out.")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def make_loss(recipe: Recipe) -> SimKGCLoss:
    return SimKGCLoss(**recipe.loss.model_dump())


def batch_loss(model, criterion: SimKGCLoss, batch: np.ndarray, train_keys: torch.Tensor, *, amp: str = "auto"):
    """The SimKGC loss of one batch of (head, relation, tail) rows: both towers, then the objective."""
    graph, device = model.bank.graph, model.device
    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    with autocast(device, amp):  # the encoders may run in bf16 on CUDA ...
        query = model.encode_queries(heads, rels, excludes=tails)  # (B, d)
        ents = model.encode_entities(np.concatenate([tails, heads]), np.concatenate([heads, tails]))
    tail_vec, head_vec = ents[: len(batch)], ents[len(batch):]  # (B, d) each
    # ... the logits do not: a 0.02 margin on cosines scaled by 1/0.05 needs fp32
    as_t = lambda x: torch.as_tensor(x, device=device)  # noqa: E731
    return criterion(query.float(), tail_vec.float(), head_vec.float(), heads=as_t(heads), rels=as_t(rels),
                     tails=as_t(tails), train_keys=train_keys, num_entities=graph.num_entities,
                     num_relations2=2 * graph.num_relations)


def train(recipe: Recipe | None = None, *, out: Path | None = None, resume: Path | None = None,
          progress: bool = True, echo=print) -> Path:
    """Train (or resume) and return the run directory."""
    from tqdm.auto import tqdm

    ckpt = None
    if resume is not None:
        run_dir = Path(resume)
        recipe = Run(run_dir).recipe
        if not (run_dir / "checkpoints" / "last.pt").is_file():
            raise KGCError(f"{run_dir}: no checkpoints/last.pt to resume from; start it again with `kgc train`.")
        ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        echo(f"resuming {run_dir} from step {ckpt['step']}")
    else:
        assert recipe is not None
        run_dir = _prepare_new_run(recipe, out)
        echo(f"run directory: {run_dir}")
    tc = recipe.train
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = pick_device(tc.device)
    seed_everything(tc.seed)

    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    if ckpt is None:
        model, tokenizer = build_model(recipe, graph, resolve_backbone(recipe.model.backbone))
        save_backbone_files(run_dir / "backbone", recipe, tokenizer)
        write_text(run_dir / "recipe.yaml", f"# kgc train --resume {run_dir}\n" + recipe.to_yaml())
    else:
        model, _ = build_model(recipe, graph, run_dir / "backbone", pretrained=False)
        model.load_state_dict(ckpt["model"])
    setup_layer_cache(model, recipe)  # freezes layers below T - n: before the optimiser sees them
    criterion = make_loss(recipe)
    model.to(device)
    criterion.to(device)

    examples = graph.both_directions("train")  # (2n, 3): every triple in both directions
    b = min(tc.batch_size, len(examples))
    steps_per_epoch = max(1, len(examples) // b)  # drop_last, as SimKGC
    total = steps_per_epoch * tc.epochs
    if tc.max_steps:
        total = min(total, tc.max_steps)
    optimizer = make_optimizer([model, criterion], tc.lr, tc.weight_decay)
    scheduler = linear_schedule(optimizer, tc.warmup_steps, total)
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and tc.amp == "fp16")
    train_keys = torch.as_tensor(graph.train_keys, device=device)
    params = [p for p in list(model.parameters()) + list(criterion.parameters()) if p.requires_grad]
    metrics = MetricsLog(run_dir / "metrics.jsonl")

    step, validated, best = 0, 0, -1.0
    if ckpt is not None:
        criterion.load_state_dict(ckpt["loss"])
        criterion.load_queue_state(ckpt["queue"], device)
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng"])
        step, validated, best = ckpt["step"], ckpt["validated_epochs"], ckpt["best_mrr"]
        metrics.truncate_after(step)

    def checkpoint() -> None:
        model.save_cache()
        save_checkpoint(run_dir / "checkpoints" / "last.pt", {
            "model": model.state_dict(), "loss": criterion.state_dict(), "queue": criterion.queue_state(),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
            "step": step, "validated_epochs": validated, "best_mrr": best, "total_steps": total})

    def validate(epoch: int) -> None:
        nonlocal best
        ev = evaluate(model, graph, "dev", batch_size=recipe.eval.batch_size, max_triples=recipe.eval.dev_queries,
                      seed=tc.seed, progress=False)
        mrr, h10 = ev.metric(), ev.metric(key="hits_at_10")
        metrics.write(step=step, epoch=epoch + 1, dev_mrr=mrr, dev_hits_at_10=h10, dev_seconds=round(ev.seconds, 2))
        improved = mrr > best
        if improved:
            best = mrr
            save_checkpoint(run_dir / "best.pt", {"model": model.state_dict(), "step": step, "dev_mrr": mrr})
        echo(f"step {step} (epoch {epoch + 1}): dev MRR {mrr:.4f}  H@10 {h10:.4f}{'  (best)' if improved else ''}  [{ev.seconds:.1f}s]")
        model.train()
        criterion.train()

    model.train()
    criterion.train()
    bar = tqdm(total=total, initial=step, desc="train", disable=not progress, dynamic_ncols=True)
    seen, t_start = 0, time.perf_counter()
    for epoch in range(step // steps_per_epoch if step < total else tc.epochs, tc.epochs):
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(tc.seed + epoch)).numpy()
        for i in range(steps_per_epoch):
            if epoch * steps_per_epoch + i < step:
                continue  # done before the resume
            if step >= total:
                break
            batch = examples[order[i * b: (i + 1) * b]]
            loss = batch_loss(model, criterion, batch, train_keys, amp=tc.amp)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            seen += len(batch)
            rate = seen / (time.perf_counter() - t_start)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", tau=f"{criterion.temperature:.4f}", triples_s=f"{rate:.1f}")
            if step % tc.log_every == 0 or step == total:
                metrics.write(step=step, epoch=epoch + 1, loss=round(loss.item(), 5), tau=criterion.temperature,
                              lr=scheduler.get_last_lr()[0], triples_per_s=round(rate, 2))
            every = recipe.eval.validate_every_steps
            if every and step % every == 0 and step % steps_per_epoch != 0 and step < total:  # else: below
                validate(epoch)
                checkpoint()  # right after: a resume never repeats or skips a validation
            elif step % tc.checkpoint_every == 0:
                checkpoint()
        if validated <= epoch:
            if recipe.eval.validate_every_epoch:
                validate(epoch)
            validated = epoch + 1
            checkpoint()
        if step >= total:
            break
    bar.close()
    if not (run_dir / "best.pt").is_file():  # no validation asked for: the final weights are the model
        save_checkpoint(run_dir / "best.pt", {"model": model.state_dict(), "step": step, "dev_mrr": None})
    model.save_cache()
    records = metrics.read()
    plot_curves(records, run_dir / "curves.png")
    rates = [r["triples_per_s"] for r in records if "triples_per_s" in r]
    unique = {id(p): p for p in list(model.parameters()) + list(criterion.parameters())}.values()
    cache = model.layer_cache
    write_json(run_dir / "train_summary.json", {
        "steps": step, "best_dev_mrr": best if best >= 0 else None, "triples_per_s": rates[-1] if rates else None,
        "trainable_params": sum(p.numel() for p in unique if p.requires_grad),
        "total_params": sum(p.numel() for p in unique), "conditioner": recipe.model.conditioner,
        "layer_cache": None if cache is None else {"layer": cache.layer, "bytes": cache.nbytes, "hits": cache.hits,
                                                   "misses": cache.misses, "folder": str(cache.folder)},
        "device": str(device), "finished": True})
    echo(f"finished {step} steps; run directory: {run_dir}")
    return run_dir


def train_from_recipe(path: str | None, overrides: list[str], **kwargs) -> Path:
    return train(load_recipe(path, overrides), **kwargs)

