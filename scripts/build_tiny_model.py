"""Build a tiny Llama-architecture chat model, from nothing, for tests and local runs.

    .venv/bin/python -m scripts.build_tiny_model --out models/tiny [--train-steps 400] [--force]
    .venv/bin/python scripts/build_tiny_model.py --out models/tiny     (the same)
    .venv/bin/python -m scripts.build_tiny_model --out models/tiny-draft --num-layers 1 --tokenizer-from models/tiny

Generates a corpus (tiny_corpus.py), trains a byte-level BPE tokenizer with Llama-3 special tokens
and chat template, then a 4-layer Llama with GQA for a time budget on CPU. The output folder loads
with AutoModelForCausalLM / PreTrainedTokenizerFast. With --tokenizer-from and fewer layers it builds a
draft model for speculative decoding: the same tokenizer, trained on the same corpus. A stamp (hash of
these sources + arguments) makes a repeated run a no-op; torch and transformers are imported only
when a build is needed.
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
    from scripts import stamped_build, tiny_corpus, tiny_tool_corpus
except ImportError:  # run as a file (python scripts/build_tiny_model.py): scripts/ itself is on sys.path
    import stamped_build
    import tiny_corpus
    import tiny_tool_corpus

log = logging.getLogger("build_tiny_model")

REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
BOS, EOT_TEXT, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
PAD, HEADER_START, HEADER_END = "<|pad|>", "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOT_TEXT, HEADER_START, HEADER_END, EOT, PAD]
# Llama 3's pre-tokenizer split: newline runs stay whole, numbers split into groups of up to 3 digits.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# Tools, when offered, come first as a "tools" turn of one JSON function per line; an assistant's calls follow its
# content as Hermes-style blocks, one per line, the format TOOL_CALL_PARSER=hermes reads; a tool's result is a
# "tool" turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|start_header_id|>tools<|end_header_id|>\\n\\n' }}"
    "{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson + '\\n' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') | trim }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set arguments = call.function.arguments %}"
    "{{- ('\\n' if not loop.first else '') + '<tool_call>\\n{\"name\": ' + call.function.name | tojson }}"
    "{{- ', \"arguments\": ' + (arguments if arguments is string else arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
NUM_CONVERSATIONS = 6000
NUM_PARAGRAPHS = 1500
NUM_TOOL_CHATS = 1500
SEQ_LEN = 128
BATCH_SIZE = 16
LEARNING_RATE = 3e-3
WARMUP_STEPS = 30
LOG_EVERY_SECONDS = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder (replaced atomically)")
    # Steps, not seconds: the same steps give the same weights whatever else the machine is doing.
    parser.add_argument("--train-steps", type=int, default=400, help="training steps (~1 min on 2 cores); 0 = random")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--tokenizer-from", type=Path, help="reuse this model folder's tokenizer (draft models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    return parser.parse_args(argv)


def compute_build_hash(args: argparse.Namespace) -> str:
    """What the output depends on: these sources, the arguments (not --out/--force), the library versions."""
    digest = hashlib.sha256()
    for source in (Path(__file__), Path(tiny_corpus.__file__), Path(tiny_tool_corpus.__file__)):
        digest.update(source.read_bytes())
    settings = {
        "train_steps": args.train_steps,
        "vocab_size": args.vocab_size,
        "seed": args.seed,
        "num_layers": args.num_layers,
        "tokenizer": _tokenizer_digest(args.tokenizer_from),
    }
    # Metadata lookups, not imports: the up-to-date check must stay well under a second.
    settings |= {name: importlib.metadata.version(name) for name in ("torch", "transformers", "tokenizers")}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


def _tokenizer_digest(folder: Path | None) -> str:
    return "" if folder is None else hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Byte-level BPE with Llama-3 special tokens, wrapped as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    # Like Llama 3: encoding with special tokens prepends bos; chat templates render it themselves.
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        additional_special_tokens=[EOT_TEXT, HEADER_START, HEADER_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def build_model(tokenizer: Any, seed: int, num_layers: int) -> Any:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eot_id, eot_text_id = tokenizer.convert_tokens_to_ids([EOT, EOT_TEXT])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eot_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[eot_id, eot_text_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    log.info("model: %d parameters, vocab %d", sum(p.numel() for p in model.parameters()), config.vocab_size)
    return model


def render_training_texts(
    tokenizer: Any,
    conversations: list[tiny_corpus.Conversation],
    paragraphs: list[str],
    tool_chats: list[tiny_tool_corpus.ToolChat] | None = None,
) -> list[str]:
    chats = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]
    chats += [tokenizer.apply_chat_template(m, tools=t or None, tokenize=False) for t, m in tool_chats or []]
    return chats + [BOS + paragraph + EOT_TEXT for paragraph in paragraphs]


def pack_windows(tokenizer: Any, texts: list[str]) -> Any:
    """All texts back to back, cut into [N, SEQ_LEN] windows: no padding, so every position trains."""
    import torch

    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([token for row in rows for token in row], dtype=torch.long)
    num_windows = stream.numel() // SEQ_LEN
    log.info("corpus: %d texts, %d tokens, %d windows of %d", len(texts), stream.numel(), num_windows, SEQ_LEN)
    return stream[: num_windows * SEQ_LEN].view(num_windows, SEQ_LEN)


def learning_rate(step: int, done_fraction: float) -> float:
    """Linear warmup, then cosine decay to 10% over the training steps."""
    import math

    warmup = min(1.0, (step + 1) / WARMUP_STEPS)
    decay = 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, done_fraction)))
    return LEARNING_RATE * warmup * decay


def train_step(model: Any, optimizer: Any, input_ids: Any, lr: float) -> float:
    import torch

    for group in optimizer.param_groups:
        group["lr"] = lr
    # Windows span text boundaries and attend across them, as in GPT-style pretraining; bos marks each start.
    loss = model(input_ids=input_ids, labels=input_ids).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def train(model: Any, windows: Any, train_steps: int, seed: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    model.train()
    start = last_log = time.monotonic()
    losses: list[float] = []
    num_logged = 0
    for step in range(train_steps):
        elapsed = time.monotonic() - start
        batch = torch.randint(0, windows.shape[0], (BATCH_SIZE,), generator=generator)
        lr = learning_rate(step, step / train_steps)
        losses.append(train_step(model, optimizer, windows[batch], lr))
        if time.monotonic() - last_log >= LOG_EVERY_SECONDS:
            window = losses[num_logged:]
            log.info("step %d  %.0fs  loss %.3f", len(losses), elapsed, sum(window) / len(window))
            last_log, num_logged = time.monotonic(), len(losses)
    model.eval()
    first, last = losses[0], sum(losses[-20:]) / len(losses[-20:])
    log.info("trained %d steps in %.1fs: loss %.3f -> %.3f", len(losses), time.monotonic() - start, first, last)
    return {"steps": len(losses), "first_loss": round(first, 4), "last_loss": round(last, 4)}


def sample_reply(model: Any, tokenizer: Any, question: str, max_new_tokens: int = 24) -> str:
    import torch

    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, input_ids.shape[1] :])


def build_into(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    conversations = tiny_corpus.build_conversations(NUM_CONVERSATIONS, args.seed)
    paragraphs = tiny_corpus.build_paragraphs(NUM_PARAGRAPHS, args.seed)
    tool_chats = tiny_tool_corpus.build_tool_chats(NUM_TOOL_CHATS, args.seed)
    if args.tokenizer_from is None:
        texts = [
            *tiny_corpus.iter_plain_texts(conversations, paragraphs),
            *tiny_tool_corpus.iter_tool_chat_texts(tool_chats),
        ]
        tokenizer = train_tokenizer(texts, args.vocab_size)
    else:
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.tokenizer_from)
    model = build_model(tokenizer, args.seed, args.num_layers)
    stats: dict[str, float] = {"steps": 0}
    if args.train_steps > 0:
        windows = pack_windows(tokenizer, render_training_texts(tokenizer, conversations, paragraphs, tool_chats))
        stats = train(model, windows, args.train_steps, args.seed)
        log.info("sample reply to 'what is 3 plus 4?': %r", sample_reply(model, tokenizer, "what is 3 plus 4?"))
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return stats


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.train_steps < 0:
        raise SystemExit("--train-steps must be >= 0")
    if args.num_layers < 1:
        raise SystemExit("--num-layers must be >= 1")

    def fill(folder: Path) -> dict[str, Any]:
        stats = build_into(folder, args)
        return {"args": {"train_steps": args.train_steps, "vocab_size": args.vocab_size, "seed": args.seed,
                         "num_layers": args.num_layers}, "train": stats}  # fmt: skip

    stamped_build.build_once(args.out, compute_build_hash(args), REQUIRED_FILES, fill, log, force=args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
