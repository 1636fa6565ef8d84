"""The built-in ``transcribe`` task's real engine: offline speech-to-text over a WAV file with pocketsphinx.

A ``[derive.<name>]`` binding runs it as an argv child (decision "derive-engine-machine")::

    python -m contextful.engine.derive.engines.transcribe [--grammar FILE.jsgf] WAV

It reads the WAV (PCM, any rate, sample width 1-4 bytes, any channel count), converts it to 16 kHz
mono 16-bit (numpy only), splits it into utterances with pocketsphinx's voice-activity
``Segmenter``, decodes each with the en-us model bundled inside the pocketsphinx wheel (nothing is
read from the network) and prints the engine output protocol (NDJSON on stdout): one passage per
utterance heard, ``{"text", "start_s", "end_s", "confidence", "modality": "text"}`` (decision
"passage-s-modality"), or ``{"status": "empty"}`` when no speech is heard. ``--grammar`` swaps the
language model for a JSGF grammar (a closed vocabulary: the decoder can only hear its sentences).

Confidence: pocketsphinx scores each recognised word with its posterior probability (the Python
bindings' ``Segment.prob``, already ``LogMath.exp`` of the decoder's log posterior; log-math
rounding can put it a hair above 1, so it is clipped to 1). An utterance's confidence is the
geometric mean of its words' posteriors (the exp of their mean log), so it stays in 0..1
whatever the word count and one doubtful word pulls the whole utterance down.

An input that is not a readable PCM WAV exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

RATE = 16_000  # the bundled en-us acoustic model's sample rate
TRAILING_SILENCE_S = 1
FILLERS = ("<", "[")  # pocketsphinx's non-words (<s>, </s>, <sil>, [NOISE], [SPEECH], ...) start so


class NotWav(ValueError):
    """The input is not a PCM WAV file this engine can read (the message says why, in one line)."""


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The file's samples as float64 in -1..1, shape (frames, channels), and its frame rate."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise NotWav(f"{path}: not a PCM WAV file ({str(exc) or 'truncated'})") from exc
    except OSError as exc:
        raise NotWav(f"{path}: unreadable ({exc.strerror or exc})") from exc
    if channels < 1 or rate < 1 or width not in (1, 2, 3, 4):
        raise NotWav(f"{path}: unsupported WAV ({channels} channels, {width}-byte samples, {rate} Hz)")
    usable = len(raw) // (width * channels) * width * channels  # a truncated last frame is dropped
    data = np.frombuffer(raw[:usable], dtype=np.uint8)
    if width == 1:  # 8-bit WAV samples are unsigned, centred on 128
        samples = (data.astype(np.float64) - 128.0) / 128.0
    elif width == 3:  # 24-bit little-endian: widen each sample to 32 bits, sign from the top byte
        triples = data.reshape(-1, 3).astype(np.int32)
        value = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        samples = np.where(value >= 1 << 23, value - (1 << 24), value).astype(np.float64) / float(1 << 23)
    else:
        dtype = np.dtype("<i2") if width == 2 else np.dtype("<i4")
        samples = np.frombuffer(data.tobytes(), dtype=dtype).astype(np.float64) / float(1 << (8 * width - 1))
    return samples.reshape(-1, channels), rate


def to_pcm16(samples: np.ndarray, rate: int, target: int = RATE) -> bytes:
    """Mono 16-bit little-endian PCM at ``target`` Hz from (frames, channels) floats in -1..1.

    Channels are averaged; a rate change low-passes below the lower Nyquist frequency (a
    Hann-windowed sinc) before interpolating, so downsampling does not fold high frequencies
    into the speech band.

    >>> len(to_pcm16(np.zeros((22050, 2)), 22050))  # one second of stereo 22.05 kHz
    32000
    """
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate != target and len(mono):
        if target < rate:
            cutoff = target / 2 / rate  # cycles per input sample
            taps = np.arange(-32, 33)
            kernel = 2 * cutoff * np.sinc(2 * cutoff * taps) * np.hanning(len(taps))
            mono = np.convolve(mono, kernel / kernel.sum(), mode="same")
        count = round(len(mono) * target / rate)
        mono = np.interp(np.arange(count) * (rate / target), np.arange(len(mono)), mono)
    return (np.clip(mono, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def decoder(grammar: Path | None) -> Any:
    """A pocketsphinx decoder over the wheel's bundled en-us model (a JSGF grammar instead of its LM)."""
    from pocketsphinx import Decoder

    # Dither (seeded: the same file always decodes the same way) keeps exact digital silence, as
    # synthesized or edited audio has, from yielding log-of-zero frames that derail the decoder.
    settings: dict[str, Any] = {"samprate": RATE, "loglevel": "FATAL", "dither": True, "seed": 1}
    if grammar is not None:
        settings["jsgf"] = str(grammar)
    return Decoder(**settings)


def passages(pcm: bytes, grammar: Path | None = None) -> Iterator[dict[str, Any]]:
    """One passage per utterance the voice-activity segmenter finds and the decoder hears words in."""
    from pocketsphinx import Segmenter

    dec = decoder(grammar)
    duration = len(pcm) / (2 * RATE)
    # Trailing silence closes an utterance still open at the end of the audio: the segmenter yields
    # a segment only when it hears speech stop, and never flushes one cut off by the end of the file.
    stream = io.BytesIO(pcm + bytes(2 * RATE * TRAILING_SILENCE_S))
    for speech in Segmenter(sample_rate=RATE).segment(stream):
        dec.start_utt()
        dec.process_raw(speech.pcm, full_utt=True)
        dec.end_utt()
        words = [seg for seg in dec.seg() or () if not seg.word.startswith(FILLERS)]  # None: no path through a grammar
        if not words:
            continue
        posteriors = [min(1.0, seg.prob) for seg in words]  # the bindings give exp(log posterior)
        confidence = math.exp(sum(math.log(p) for p in posteriors) / len(posteriors)) if min(posteriors) > 0 else 0.0
        yield {
            "text": " ".join(seg.word.split("(")[0] for seg in words),  # "read(2)": a pronunciation variant
            "start_s": round(speech.start_time, 3),
            "end_s": round(min(speech.end_time, duration), 3),  # not into the padding
            "confidence": round(confidence, 4),
            "modality": "text",
        }


def transcribe(path: Path, grammar: Path | None = None) -> list[dict[str, Any]]:
    """The protocol lines for one WAV file: its passages, or one ``{"status": "empty"}``."""
    samples, rate = read_wav(path)
    found = list(passages(to_pcm16(samples, rate), grammar))
    return found or [{"status": "empty"}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contextful.engine.derive.engines.transcribe",
                                     description="Transcribe a WAV file offline; print NDJSON passages.")
    parser.add_argument("--grammar", type=Path, help="a JSGF grammar file: decode only its sentences")
    parser.add_argument("wav", type=Path, help="the WAV file to transcribe")
    args = parser.parse_args(argv)
    if args.grammar is not None and not args.grammar.is_file():
        print(f"error: {args.grammar}: no such grammar file", file=sys.stderr)
        return 2
    try:
        lines = transcribe(args.wav, args.grammar)
    except NotWav as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        sys.stdout.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
