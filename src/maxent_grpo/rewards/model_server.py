"""A reward model served over HTTP: the reward-server contract, scored by a classifier.

    MAXENT_GRPO_SERVER_TOKEN=... python -m maxent_grpo.rewards.model_server --model PATH --port 8001

The launcher starts it when a recipe sets reward_model_gpus (launch/plan/reward_model.py: its
GPUs, port and command; launch/reward_server.py: the process, its /health wait, its stop), and
the trainers score the recipe's `model:` entry through the reward-server client
(remote.RemoteReward) instead of loading the model themselves. It answers POST /score by the
contract of docs/tools.md and GET /health with 200 once the model is loaded. It binds
loopback unless told otherwise (--host; the launcher gives it the plan's address) and answers
/score only with the run's token (server_auth.TOKEN_VARIABLE, or --token-env's variable): it
refuses to start without one.

It scores as TRL scores a reward model inside the trainer (GRPOTrainer._calculate_rewards):
chat prompts through the reward model's chat template (prompt + completion messages), plain
text as prompt + completion; right padding, no special tokens added, logits[:, 0]. With
several GPUs it holds one copy of the model per GPU and splits each request between them.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from maxent_grpo.rewards.example_server import make_server, server_token
from maxent_grpo.server_auth import TOKEN_VARIABLE

DEFAULT_BATCH = 16


def texts_of(body: dict[str, Any], tokenizer) -> list[str]:
    """The text each completion is scored on, as TRL builds it for a reward model."""
    prompts, completions = body["prompts"], body["completions"]
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    texts = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if isinstance(prompt, list):  # chat messages: the whole conversation, templated
            messages = prompt + (completion if isinstance(completion, list) else [])
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        else:
            texts.append(f"{prompt or ''}{completion}")
    return texts


class RewardModel:
    """A sequence-classification model (one label) on each of `devices`; `__call__` scores
    a request body, split evenly between the copies, `batch` texts at a time on each."""

    def __init__(self, path: str, devices: list[str], batch: int = DEFAULT_BATCH):
        from transformers import (  # deferred: torch and transformers, seconds
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.models = []
        for device in devices:
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype="auto"
            )
            # The score is read at the last token that is not padding: pad ids must agree.
            model.config.pad_token_id = self.tokenizer.pad_token_id
            self.models.append(model.to(device).eval())
        self.batch = batch
        self._pool = ThreadPoolExecutor(max_workers=len(self.models))

    def __call__(self, body: dict[str, Any]) -> list[float]:
        texts = texts_of(body, self.tokenizer)
        n = len(self.models)
        shards = [texts[i * len(texts) // n : (i + 1) * len(texts) // n] for i in range(n)]
        scored = self._pool.map(self._score, self.models, shards)
        return [score for shard in scored for score in shard]

    def _score(self, model, texts: list[str]) -> list[float]:
        import torch  # deferred: loaded with the model

        scores: list[float] = []
        for start in range(0, len(texts), self.batch):
            inputs = self.tokenizer(
                text=texts[start : start + self.batch],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            ).to(model.device)
            with torch.inference_mode():
                scores += model(**inputs).logits[:, 0].float().tolist()
        return scores


def _devices() -> list[str]:
    """One copy per visible GPU (the plan's CUDA_VISIBLE_DEVICES), else the CPU."""
    import torch  # deferred: seconds

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]


def _logged(scorer: RewardModel):
    lock = threading.Lock()

    def score(body: dict[str, Any]) -> list[float]:
        start = time.monotonic()
        scores = scorer(body)
        with lock:  # one line per request: how many, how long (the run's scoring time)
            print(f"scored {len(scores)} in {time.monotonic() - start:.3f}s", flush=True)
        return scores

    return score


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a hub id or a local directory")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token-env", default=TOKEN_VARIABLE, help="the token's variable")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="texts per forward")
    args = parser.parse_args(argv)
    token = server_token(args.token_env)  # before the model's load: a missing one exits now
    devices = _devices()
    start = time.monotonic()
    scorer = RewardModel(args.model, devices, args.batch)
    # The port opens only now: /health answers once the model can score.
    server = make_server(args.port, _logged(scorer), host=args.host, token=token)
    print(
        f"reward model {args.model} on {', '.join(devices)} loaded in "
        f"{time.monotonic() - start:.1f}s; POST http://{args.host}:{args.port}/score",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the launcher's stop (SIGINT: launch/processes.py SERVER_STOP)
        print("reward model server stopped", flush=True)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
