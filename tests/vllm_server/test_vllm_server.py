"""A real vLLM server (CPU build) on the tiny model, and GRPO training against it.

The session's disk-sync server (shared_servers.py; starting one costs 30-75 s on CPU), started
exactly as the launcher starts it (plan.make_plan -> server.VLLMServer) for a recipe with these
server keys; the module's recipe would start the very same server.
"""

from __future__ import annotations

import http.client
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from shared_servers import SHARED_KEYS, plan_on

from helpers.auth import session
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.runs import REPO, child_env, log_history
from maxent_grpo.recipe import read_recipe
from maxent_grpo.train.vllm_sync import reload_weights
from maxent_grpo.vllm_health import probe

pytestmark = pytest.mark.vllm

GRPO = str(REPO / "src" / "grpo.py")
TOLERANCE = 1e-5  # float32 on both sides
HTTP = session()  # sends the run's token (the server refuses requests without it)
TEXT = "What is the sum of 12 plus 30? <think> 12 plus 30 </think> <answer> 42 </answer>"


def measured(name: str, value: float, unit: str = "s") -> None:
    print(f"\nMEASURED {name}: {value:.3g}{unit}", flush=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model, disk_server):
    """(plan, url, model id, tmp dir): the session's disk-sync server, and the plan of the
    recipe this module trains (which would start the very same server)."""
    tmp = tmp_path_factory.mktemp("vllm-server")
    recipe = write_recipe(
        tmp,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        output_dir=str(tmp / "out"),
        max_steps=3,
        save_steps=1,
        # A dense reward, so that the weights really move between syncs.
        reward_funcs=["digit_fraction"],
        reward_weights=[1.0],
        max_completion_length=16,
        **SHARED_KEYS["disk"],
    )
    request = read_recipe(["--config", str(recipe)]).with_values(
        use_vllm=True,
        vllm_mode="server",
        vllm_server_gpu_memory_utilization=0.1,
        vllm_server_device="cpu",
        vllm_server_dtype="float32",
        vllm_server_enforce_eager=True,
        vllm_server_timeout=300,
    )
    plan, _ = plan_on(disk_server, request)
    url = plan.server.url
    # Earlier tests trained against this server: put the base model back (the same reload
    # the trainers' disk sync does), so that "before training" means the initial model.
    reload_weights(SimpleNamespace(base_url=url, session=HTTP), tiny_model)
    assert HTTP.post(f"{url}/reset_prefix_cache", timeout=30).status_code == 200
    model_id = HTTP.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    yield SimpleNamespace(plan=plan, url=url, model_id=model_id, tmp=tmp, server=disk_server)


def token_ids(model_dir: Path, text: str = TEXT) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]


def hf_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, by transformers in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def server_prompt_logprobs(served, ids: list[int]) -> list[float]:
    response = HTTP.post(
        f"{served.url}/v1/completions",
        json={
            "model": served.model_id,
            "prompt": [ids],
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    per_position = response.json()["choices"][0]["prompt_logprobs"]
    return [per_position[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_health_answers_on_health_and_health_slash(served):
    assert probe(served.plan.server.health_url) == 200
    # Only the exact /health is open (issue 57): /health/ asks for the token like any route.
    assert probe(f"{served.url}/health/") == 401
    connection = http.client.HTTPConnection("127.0.0.1", served.plan.server.port, timeout=10)
    connection.request("GET", "/health/", headers=HTTP.headers)
    response = connection.getresponse()
    assert response.status == 307 and response.getheader("location").endswith("/health")


def test_generation_through_trls_client(served, tiny_model):
    from maxent_grpo.train.vllm_connect import authorized_client_class

    client = authorized_client_class()(base_url=served.url, connection_timeout=10)
    ids = token_ids(tiny_model)
    out = client.generate(prompts=[ids], n=3, max_tokens=8, temperature=1.0, logprobs=0)
    assert out["prompt_ids"] == [ids]
    assert len(out["completion_ids"]) == 3
    assert all(1 <= len(c) <= 8 for c in out["completion_ids"])
    assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in out["completion_ids"]]
    text = HTTP.post(
        f"{served.url}/v1/completions",
        json={"model": served.model_id, "prompt": "What is", "max_tokens": 4},
        timeout=60,
    ).json()
    assert text["choices"][0]["text"] is not None


def test_server_logprobs_match_transformers_before_training(served, tiny_model):
    ids = token_ids(tiny_model)
    diff = max_diff(server_prompt_logprobs(served, ids), hf_logprobs(tiny_model, ids))
    measured("initial model: max |server - transformers| logprob", diff, "")
    assert diff < TOLERANCE


def test_grpo_with_disk_sync_keeps_the_server_on_the_trained_weights(served, tiny_model):
    """Train 3 steps against the server; every sync must land, exactly."""
    from maxent_grpo.train.vllm_sync import WEIGHTS_DIRNAME, _SafetensorsWriter, reload_weights

    plan = served.plan
    env = child_env(**plan.train.env)
    start = time.monotonic()
    result = subprocess.run(
        list(plan.train.command), cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    measured("training 3 steps against the server (1 CPU process)", time.monotonic() - start)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = served.tmp / "out"

    steps = {e["step"]: e for e in log_history(out) if "loss" in e}
    assert sorted(steps) == [1, 2, 3]
    syncs = [steps[s]["vllm/weight_sync_seconds"] for s in (1, 2, 3)]
    measured("disk weight sync per step (mean of 3)", sum(syncs) / 3)
    assert all(s > 0 for s in syncs)
    # TRL's own check, every step: the server's logprobs of the sampled tokens vs the trainer's.
    assert all(steps[s]["sampling/sampling_logp_difference/max"] < 1e-4 for s in steps)
    assert any(steps[s]["grad_norm"] > 0 for s in steps)
    assert not (out / WEIGHTS_DIRNAME).exists()  # every sync directory was cleaned up

    # The server got the weights as of the last sync: before step 3, i.e. checkpoint-2.
    ids = token_ids(tiny_model)
    on_server = server_prompt_logprobs(served, ids)
    synced = hf_logprobs(out / "checkpoint-2", ids)
    diff = max_diff(on_server, synced)
    measured("after training: max |server - checkpoint-2| logprob", diff, "")
    assert diff < TOLERANCE
    assert max_diff(synced, hf_logprobs(tiny_model, ids)) > 1e-4  # the weights did move

    # Completion logprobs too: sample on the server, score with transformers.
    response = HTTP.post(
        f"{served.url}/v1/completions",
        json={
            "model": served.model_id,
            "prompt": [ids],
            "max_tokens": 8,
            "temperature": 1.0,
            "logprobs": 0,
            "seed": 1,
            "return_token_ids": True,
        },
        timeout=60,
    ).json()["choices"][0]
    completion = response["token_ids"]
    scored = hf_logprobs(out / "checkpoint-2", ids + completion)[len(ids) - 1 :]
    assert max_diff(response["logprobs"]["token_logprobs"], scored) < TOLERANCE

    # And the final model, pushed the way the trainer pushes (sharded safetensors + reload).
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    writer = _SafetensorsWriter(served.tmp / "final-push", shard_bytes=200_000)
    for name, param in final.named_parameters():
        writer.add(name, param.data)
    assert writer.close() > 1
    client = SimpleNamespace(base_url=served.url, session=HTTP)
    start = time.monotonic()
    reload_weights(client, writer.directory)
    measured("reload_weights of the final model", time.monotonic() - start)
    diff = max_diff(server_prompt_logprobs(served, ids), hf_logprobs(out, ids))
    measured("final model: max |server - transformers| logprob", diff, "")
    assert diff < TOLERANCE
