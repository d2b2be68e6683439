"""Build a small SAE for the tiny model, in SAELens' on-disk format, for tests and the demo.

    .venv/bin/python -m scripts.build_tiny_sae --model models/tiny --out models/saes/tiny/resid_post_2

A standard (ReLU) SAE on `blocks.2.hook_resid_post`, trained for a few seconds on the model's residual
stream over generated text, whose first features are then replaced by constructed ones: feature i's
decoder vector is a direction along which one chosen token's logit, through the final norm and unembedding,
beats every other token's, so steering with it has a known effect. `steering_demo.json` lists those features,
their tokens and a strength at which the token becomes the model's top choice. A stamp (hash of these
sources, the model's own stamp and the arguments) makes a repeated run a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import time
from pathlib import Path
from typing import Any

try:
    from scripts import build_tiny_model, stamped_build, tiny_corpus
except ImportError:  # run as a file: scripts/ itself is on sys.path
    import build_tiny_model
    import stamped_build
    import tiny_corpus

log = logging.getLogger("build_tiny_sae")

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_NAME = "steering_demo.json"
REQUIRED_FILES = ("cfg.json", "sae_weights.safetensors", DEMO_NAME)
LAYER = 2
D_SAE = 512
DEMO_TOKENS = (" blue", " cats", " honey")  # features 0, 1, 2
PROBE_QUESTIONS = ("tell me about dogs", "what is 3 plus 4?", "name a day of the week", "what is the capital of Peru?")
NUM_CONVERSATIONS = 400
NUM_PARAGRAPHS = 100
NUM_WINDOWS = 96
BATCH_SIZE = 512
LEARNING_RATE = 5e-3
L1_COEFFICIENT = 0.5
STRENGTHS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
STRENGTH_MARGIN = 2.0  # the recorded strength is this times the smallest that worked on every probe
SEPARATION_STEPS, SEPARATION_LR, SEPARATION_SCALE = 100, 0.05, 4.0  # logit_direction's ascent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "tiny", help="the tiny model's folder")
    parser.add_argument("--out", type=Path, required=True, help="output SAE folder (replaced atomically)")
    parser.add_argument("--train-steps", type=int, default=400, help="SAE training steps (a few seconds on 2 cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    return parser.parse_args(argv)


def compute_build_hash(args: argparse.Namespace) -> str:
    """These sources, the SAE format code, the model's own build hash, the arguments, the library versions."""
    digest = hashlib.sha256()
    steering = REPO_ROOT / "steering"
    for source in (Path(__file__), Path(tiny_corpus.__file__), steering / "sae.py", steering / "sae_math.py"):
        digest.update(source.read_bytes())
    try:
        model_hash = json.loads((args.model / stamped_build.STAMP_NAME).read_text())["build_hash"]
    except (OSError, ValueError, KeyError):
        model_hash = None  # a model from elsewhere: its folder's path stands in
    settings = {"train_steps": args.train_steps, "seed": args.seed, "model": model_hash or str(args.model.resolve())}
    settings |= {name: importlib.metadata.version(name) for name in ("torch", "transformers", "safetensors")}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


def collect_residuals(model: Any, tokenizer: Any, seed: int) -> Any:
    """The residual stream after decoder layer LAYER over generated text: [T, hidden]."""
    import torch

    conversations = tiny_corpus.build_conversations(NUM_CONVERSATIONS, seed + 1)
    paragraphs = tiny_corpus.build_paragraphs(NUM_PARAGRAPHS, seed + 1)
    texts = build_tiny_model.render_training_texts(tokenizer, conversations, paragraphs)
    windows = build_tiny_model.pack_windows(tokenizer, texts)[:NUM_WINDOWS]  # [W, SEQ_LEN]
    captured: list[Any] = []
    handle = model.model.layers[LAYER].register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        with torch.no_grad():
            model(input_ids=windows)
    finally:
        handle.remove()
    return captured[0].reshape(-1, model.config.hidden_size)


def train_sae(residuals: Any, config: Any, steps: int, seed: int) -> dict[str, Any]:
    """A standard SAE trained on `residuals` [T, d_in] with MSE plus a decoder-norm-weighted L1 penalty."""
    import torch

    from steering.sae import SAE
    from steering.sae_math import decode, encode

    generator = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(config.d_sae, config.d_in, generator=generator)
    W_dec = 0.1 * W_dec / W_dec.norm(dim=-1, keepdim=True)
    params = {
        "W_enc": W_dec.T.clone().requires_grad_(),
        "W_dec": W_dec.requires_grad_(),
        "b_enc": torch.zeros(config.d_sae, requires_grad=True),
        "b_dec": residuals.mean(dim=0).clone().requires_grad_(),
    }
    optimizer = torch.optim.Adam(params.values(), lr=LEARNING_RATE)
    started, losses = time.monotonic(), []
    for _ in range(steps):
        batch = residuals[torch.randint(0, residuals.shape[0], (BATCH_SIZE,), generator=generator)]
        sae = SAE(config, **params)
        acts = encode(sae, batch)  # [B, d_sae]
        loss = (decode(sae, acts) - batch).pow(2).sum(-1).mean()
        loss = loss + L1_COEFFICIENT * (acts * params["W_dec"].norm(dim=-1)).sum(-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        l0 = (encode(SAE(config, **params), residuals) > 0).sum(-1).float().mean().item()
    log.info(
        "trained %d steps in %.1fs: loss %.3f -> %.3f, L0 %.1f",
        steps,
        time.monotonic() - started,
        losses[0],
        losses[-1],
        l0,
    )
    return {name: tensor.detach() for name, tensor in params.items()}


def logit_direction(model: Any, token_id: int) -> Any:
    """A unit residual direction along which token_id out-scores every other token through the final RMSNorm's
    weight and lm_head. It starts as the direction that raises token_id's logit most, then moves away from the
    tokens whose unembeddings lie close to it (a model that writes " white" and " blue" in the same places
    gives them nearly parallel rows, and the plain direction raises the longer one most)."""
    import torch

    gain, unembedding = model.model.norm.weight.detach(), model.lm_head.weight.detach()  # [hidden], [V, hidden]
    direction = (gain * unembedding[token_id]).requires_grad_()
    optimizer = torch.optim.Adam([direction], lr=SEPARATION_LR)
    target = torch.tensor([token_id])
    for _ in range(SEPARATION_STEPS):
        logits = unembedding @ (gain * direction / direction.norm())  # [V]
        loss = torch.nn.functional.cross_entropy(SEPARATION_SCALE * logits[None], target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    direction = direction.detach()
    return direction / direction.norm()


def last_logits(model: Any, prompts: list[Any], delta: Any) -> Any:
    """Last-position logits [len(prompts), V] with `delta` [hidden] added after decoder layer LAYER."""
    import torch

    handle = model.model.layers[LAYER].register_forward_hook(lambda module, args, output: output + delta)
    try:
        with torch.no_grad():
            return torch.stack([model(input_ids=prompt).logits[0, -1] for prompt in prompts])
    finally:
        handle.remove()


def calibrate_strength(model: Any, prompts: list[Any], direction: Any, token_id: int) -> float:
    for strength in STRENGTHS:
        if bool((last_logits(model, prompts, strength * direction).argmax(-1) == token_id).all()):
            return strength * STRENGTH_MARGIN
    raise RuntimeError(f"no strength up to {STRENGTHS[-1]} makes token {token_id} the top choice")


def construct_features(model: Any, tokenizer: Any, tensors: dict[str, Any], residuals: Any) -> list[dict[str, Any]]:
    """Overwrites features 0.. with one per DEMO_TOKENS entry; returns what steering_demo.json records."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        for q in PROBE_QUESTIONS
    ]
    features = []
    for index, text in enumerate(DEMO_TOKENS):
        (token_id,) = tokenizer.encode(text, add_special_tokens=False)
        direction = logit_direction(model, token_id)
        projections = (residuals - tensors["b_dec"]) @ direction  # [T]
        tensors["W_dec"][index] = direction
        tensors["W_enc"][:, index] = direction
        # Silent on ordinary text, so monitoring shows the feature firing only when it is steered in.
        tensors["b_enc"][index] = -projections.max()
        strength = calibrate_strength(model, prompts, direction, token_id)
        features.append({"index": index, "token_id": token_id, "token": text, "strength": strength})
        log.info("feature %d raises %r (id %d); steering strength %.0f", index, text, token_id, strength)
    return features


def sae_lens_cfg(config: Any) -> dict[str, Any]:
    """cfg.json as SAELens 6 writes it: architecture fields on top, where it was trained under metadata."""
    return {
        "architecture": config.architecture,
        "d_in": config.d_in,
        "d_sae": config.d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": config.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {
            "sae_lens_version": "6.0.0",
            "model_name": "tiny",
            "hook_name": config.hook_name,
            "hook_head_index": None,
            "prepend_bos": True,
            "context_size": build_tiny_model.SEQ_LEN,
            "dataset_path": "scripts/tiny_corpus.py",
            "built_by": "scripts/build_tiny_sae.py",
        },
    }


def build_into(folder: Path, args: argparse.Namespace) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from steering.sae_config import SAEConfig

    # One thread: the same weights on any machine, and no OpenMP spinning against other work on a busy one.
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    config = SAEConfig(d_in=model.config.hidden_size, d_sae=D_SAE, hook_name=f"blocks.{LAYER}.hook_resid_post")
    residuals = collect_residuals(model, tokenizer, args.seed)
    tensors = train_sae(residuals, config, args.train_steps, args.seed)
    demo = {"sae_hook_name": config.hook_name, "features": construct_features(model, tokenizer, tensors, residuals)}
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / "sae_weights.safetensors")
    (folder / "cfg.json").write_text(json.dumps(sae_lens_cfg(config), indent=2) + "\n")
    (folder / DEMO_NAME).write_text(json.dumps(demo, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.train_steps < 0:
        raise SystemExit("--train-steps must be >= 0")

    def fill(folder: Path) -> dict[str, Any]:
        build_into(folder, args)
        return {}

    stamped_build.build_once(args.out, compute_build_hash(args), REQUIRED_FILES, fill, log, force=args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
