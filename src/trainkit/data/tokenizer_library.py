"""data.tokenizer=bpe (a byte-level BPE learned from the training split) and a local tokenizer folder, read and
learned with Hugging Face's `tokenizers` (and `transformers` for a folder without tokenizer.json), imported inside
the functions that use them. trainkit.data.tokenizing (bytes) reaches them from its marked lines.
"""

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

BPE = "bpe"
SAVED_FOLDER = "tokenizer"  # <run>/tokenizer/tokenizer.json: data.tokenizer=bpe's file
PAD_TOKEN = "<pad>"  # the BPE's id 0


class TextTokens:
    """A `tokenizers.Tokenizer` (our BPE, or a local folder's), with the padding id the data pads with."""

    def __init__(self, tokenizer: Any, name: str, pad_id: int | None):
        self.tokenizer, self.name, self.pad_id = tokenizer, name, pad_id
        if name == BPE:
            tokenizer.encode_special_tokens = True  # "<pad>" written in a text is text, not the padding id
        self.vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
        self._truncating_copies: dict[int, Any] = {}

    def encode(self, text: bytes) -> torch.Tensor:
        return torch.tensor(self.tokenizer.encode(text.decode("utf-8")).ids, dtype=torch.int64)

    def encode_many(self, texts: list[bytes]) -> list[torch.Tensor]:
        """Every text's ids, the batch encoded in parallel by the library."""
        encoded = self.tokenizer.encode_batch([text.decode("utf-8") for text in texts])
        return [torch.tensor(encoding.ids, dtype=torch.int64) for encoding in encoded]

    def encode_cut(self, texts: list[bytes], max_length: int) -> tuple[list[torch.Tensor], list[int]]:
        """Every text's ids cut at max_length as the tokenizer truncates (before its special tokens, so `[SEP]` stays),
        and each text's uncut length."""
        encoded = self.encode_many(texts)
        lengths = [len(ids) for ids in encoded]
        long = [index for index, length in enumerate(lengths) if length > max_length]
        if long:
            cut = self._truncating(max_length).encode_batch([texts[index].decode("utf-8") for index in long])
            for index, encoding in zip(long, cut, strict=True):
                encoded[index] = torch.tensor(encoding.ids, dtype=torch.int64)
        return encoded, lengths

    def _truncating(self, max_length: int) -> Any:
        """A copy of the tokenizer that truncates to max_length; the original's JSON is the fingerprint's."""
        from tokenizers import Tokenizer

        if max_length not in self._truncating_copies:
            copy = Tokenizer.from_str(self.tokenizer.to_str())
            copy.encode_special_tokens = self.tokenizer.encode_special_tokens
            direction = (self.tokenizer.truncation or {}).get("direction", "right")
            copy.enable_truncation(max_length, direction=direction)
            self._truncating_copies[max_length] = copy
        return self._truncating_copies[max_length]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_bytes(self) -> torch.Tensor:
        """The bytes of text each id stands for (special tokens: 0): a byte-level token's characters, for other
        tokenizers its decoded text's."""
        from tokenizers import decoders

        byte_level = isinstance(self.tokenizer.decoder, decoders.ByteLevel)
        special = {token.content for token in self.tokenizer.get_added_tokens_decoder().values() if token.special}
        counts = torch.zeros(self.vocabulary)
        for token, index in self.tokenizer.get_vocab(with_added_tokens=True).items():
            if token not in special:
                counts[index] = len(token) if byte_level else len(self.tokenizer.decode([index]).encode("utf-8"))
        return counts

    def fingerprint(self) -> str | None:
        return f"{self.name} sha256:{hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]}"

    def __getstate__(self) -> dict:  # DataLoader workers get the tokenizer as its JSON
        return {"json": self.tokenizer.to_str(), "name": self.name, "pad_id": self.pad_id}

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer

        self.__init__(Tokenizer.from_str(state["json"]), state["name"], state["pad_id"])  # type: ignore[misc]


def library_tokenizer_problems(tokenizer: str, vocab_size: int) -> Iterator[tuple[str, str]]:
    """What the config check asks of a data.tokenizer other than bytes, and of data.vocab_size (a folder's files,
    not its tokens)."""
    if tokenizer == BPE:
        if vocab_size <= 257:
            yield "data.vocab_size", f"is {vocab_size}; a byte-level BPE holds <pad> and the 256 bytes: set more"
        return
    folder = Path(tokenizer).expanduser()
    if not folder.is_dir():
        yield (
            "data.tokenizer",
            f"is {tokenizer!r}: neither bytes, bpe nor a folder; give bytes, bpe, or a local tokenizer folder "
            f"(one saved with save_pretrained, holding tokenizer.json)",
        )
    elif not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        yield (
            "data.tokenizer",
            f"'{folder}' holds no tokenizer.json or tokenizer_config.json; point it at a folder a tokenizer was "
            f"saved to (tokenizer.save_pretrained(folder))",
        )


def library_tokens(
    spec: str,
    vocab_size: int,
    training_texts: Callable[[], Iterable[bytes]] | None,
    saved_in: Path | None,
    needs_padding: bool,
) -> TextTokens:
    """The tokenizer a data.tokenizer other than bytes names. bpe is read back from <saved_in>/tokenizer/ where it
    exists, else trained by rank 0 and saved there; every rank gets rank 0's."""
    if spec == BPE:
        from tokenizers import Tokenizer

        from trainkit.distributed import gather_objects, process_info

        rank_0s = _bpe_json(vocab_size, training_texts, saved_in) if process_info().is_main else None
        tokenizer = Tokenizer.from_str(gather_objects(rank_0s)[0])
        return TextTokens(tokenizer, BPE, tokenizer.token_to_id(PAD_TOKEN))
    return folder_tokenizer(Path(spec).expanduser(), needs_padding)


def saved_tokenizer(run_dir: Path) -> Path:
    return run_dir / SAVED_FOLDER / "tokenizer.json"


def _bpe_json(vocab_size: int, training_texts: Callable[[], Iterable[bytes]] | None, saved_in: Path | None) -> str:
    saved = saved_tokenizer(saved_in) if saved_in is not None else None
    if saved is not None and saved.is_file():
        log.info("data.tokenizer=bpe: %s (saved by the run)", saved)
        return saved.read_text(encoding="utf-8")
    if saved is None or training_texts is None:
        where = f"there is no {saved}" if saved is not None else "this checkpoint is not inside a run directory"
        raise ConfigError(
            "data.tokenizer",
            f"is bpe, trained by the run and saved in its directory (tokenizer/tokenizer.json), but {where}; "
            f"evaluate the checkpoint in the run directory that holds it",
        )
    import time

    started = time.perf_counter()
    tokenizer = train_bpe(vocab_size, (sample.decode("utf-8") for sample in training_texts()))
    saved.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(saved))
    log.info(
        "data.tokenizer=bpe: %d ids learned from the training split in %.1fs -> %s",
        tokenizer.get_vocab_size(),
        time.perf_counter() - started,
        saved,
    )
    return saved.read_text(encoding="utf-8")


def train_bpe(vocab_size: int, texts: Iterable[str]) -> Any:
    """A byte-level BPE of at most `vocab_size` ids: <pad> (id 0), the 256 bytes, then merges; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def folder_tokenizer(folder: Path, needs_padding: bool) -> TextTokens:
    """A local folder's tokenizer: tokenizer.json read with `tokenizers`, which avoids importing transformers, else
    what AutoTokenizer reads there."""
    file = folder / "tokenizer.json"
    if file.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(file))
    else:
        from transformers import AutoTokenizer

        try:
            loaded = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as error:
            reason = str(error).strip().splitlines()[0]
            raise ConfigError("data.tokenizer", f"cannot read a tokenizer from '{folder}' ({reason})") from error
        if not getattr(loaded, "is_fast", False):
            raise ConfigError(
                "data.tokenizer",
                f"'{folder}' holds a slow tokenizer only; save it as a fast one "
                f"(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(folder) writes tokenizer.json)",
            )
        tokenizer = loaded.backend_tokenizer
    pad_id = _pad_id(folder, tokenizer)
    if pad_id is None and needs_padding:
        raise ConfigError(
            "data.tokenizer",
            f"'{folder}' names no padding token (tokenizer_config.json's pad_token), and text classification pads; "
            f"set one (tokenizer.pad_token = tokenizer.eos_token; tokenizer.save_pretrained(folder))",
        )
    return TextTokens(tokenizer, str(folder), pad_id)


def _pad_id(folder: Path, tokenizer: Any) -> int | None:
    config = folder / "tokenizer_config.json"
    pad = json.loads(config.read_text(encoding="utf-8")).get("pad_token") if config.is_file() else None
    if isinstance(pad, dict):  # an AddedToken written out
        pad = pad.get("content")
    if isinstance(pad, str) and tokenizer.token_to_id(pad) is not None:
        return int(tokenizer.token_to_id(pad))
    padding = tokenizer.padding
    return int(padding["pad_id"]) if padding else None
