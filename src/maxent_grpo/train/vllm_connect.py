"""The trainer's connection to a vLLM server (`vllm_mode: server`), made at its first use.

The launcher starts the server and the trainers together (launch/attempt.py): the trainers
import, load the model and the data, build the optimizer while the server boots, and the
main process connects at the first generation or weight sync. The connection first waits
for /health with the recipe's `vllm_server_timeout` (vllm_health.py HealthWait: a bound on
each request and on the whole wait) and fails with one line (ServerError, a UserError) if
the server never answers 200. TRL's own wait (VLLMClient.check_server) has no request
timeout and retries a non-200 answer forever; after ours it succeeds at once.

TRL 1.16's VLLMGeneration connects in its __init__ (`_init_vllm`, inside GRPOTrainer's
__init__). `deferred_generation_class()` is the subclass that defers this to the first use of
`vllm_client`; train/vllm_sync.py makes GRPOTrainer build it in server mode. GRPOTrainer's
__init__ uses the client once, for a warning about the server's logprobs mode: a stand-in
answers that, and the check runs for real once connected.
"""

from __future__ import annotations

import functools
import logging
import os

from maxent_grpo.rundir.events import emit
from maxent_grpo.server_auth import auth_headers
from maxent_grpo.train.server_pool import ServerPool
from maxent_grpo.vllm_health import SERVERS_VARIABLE, HealthWait, group_port_of, server_urls

logger = logging.getLogger(__name__)

LOGPROBS_MODE = "processed_logprobs"  # what TRL's importance sampling correction needs


def wait_for_server(base_url: str, timeout: float, poll: float = 1.0) -> float:
    """Wait until base_url/health answers 200; raises ServerError after `timeout` seconds."""
    url = f"{base_url.rstrip('/')}/health"
    # print, not logging: shown whatever the log level (the main process only calls this)
    print(f"Waiting for the vLLM server at {url} (vllm_server_timeout {timeout:g}s)", flush=True)
    took = HealthWait(None, url, timeout).wait(poll)
    print(f"vLLM server at {url} answered after {took:.1f}s of waiting", flush=True)
    return took


def check_logprobs_mode(client) -> None:
    """TRL's warning (GRPOTrainer.__init__) about a server that biases its correction."""
    mode = client.get_server_info()["model_config"]["logprobs_mode"]
    if mode != LOGPROBS_MODE:
        logger.warning(
            "The vLLM server runs with `--logprobs-mode %s`, which biases the importance "
            "sampling correction. Restart it with `--logprobs-mode %s`, or set "
            "`vllm_importance_sampling_correction=False`.",
            mode,
            LOGPROBS_MODE,
        )


class _Unconnected:
    """Stands for the VLLMClient until its first use connects it."""

    def __init__(self, generation):
        self._generation = generation

    def get_server_info(self) -> dict:
        # GRPOTrainer.__init__'s logprobs-mode check: it runs for real once connected.
        self._generation.logprobs_check_due = True
        return {"model_config": {"logprobs_mode": LOGPROBS_MODE}}

    def __getattr__(self, name: str):
        return getattr(self._generation.connect(), name)


@functools.cache
def authorized_client_class():
    """TRL's VLLMClient whose requests carry the run's token (server_auth.auth_headers): its
    __init__ makes the session and uses it at once (/v1/models), so the headers go on the
    session as it is set. Every call made through `client.session` (generation, weight
    sync, the pool's) sends them; TRL's own /health check needs none."""
    from trl.generation.vllm_client import VLLMClient  # TRL is slow to import

    class AuthorizedVLLMClient(VLLMClient):
        @property
        def session(self):
            return self._session

        @session.setter
        def session(self, session) -> None:
            session.headers.update(auth_headers())
            self._session = session

    return AuthorizedVLLMClient


@functools.cache
def deferred_generation_class():
    """TRL's VLLMGeneration, connecting to the server at the first use (built lazily: TRL is
    slow to import)."""
    from trl.generation.vllm_generation import VLLMGeneration

    class DeferredVLLMGeneration(VLLMGeneration):
        """Server mode: the client is made when first used (the main process only uses it)."""

        _client = None
        logprobs_check_due = False
        run_dir = None  # output_dir: the server pool's events (set by the VLLMSync component)

        @property
        def vllm_client(self):
            return self._client if self._client is not None else _Unconnected(self)

        @vllm_client.setter
        def vllm_client(self, client) -> None:  # TRL's _init_vllm assigns it
            self._client = client

        def _init_vllm(self):
            if self.mode != "server":
                return super()._init_vllm()
            return None  # connect() at the first use of vllm_client

        def connect(self):
            """Wait for the server (bounded), then open the client; once."""
            if self._client is None:
                urls = server_urls(os.environ.get(SERVERS_VARIABLE))
                if len(urls) > 1 and self.server_base_url is None:  # vllm_nodes > 1
                    self._client = self._open_pool(urls)
                else:
                    url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                    wait_for_server(url, self.server_timeout)
                    self._open_client(url)
                if self.logprobs_check_due:
                    check_logprobs_mode(self._client)
            return self._client

        def _open_client(self, base_url: str) -> None:
            """TRL's own connection (its _init_vllm in server mode, on the main process, which
            alone connects): the client and the NCCL weight-transfer group."""
            self.vllm_client = self._new_client(base_url, self.group_port)
            self.vllm_client.init_communicator(device=self.accelerator.device)

        def _open_pool(self, urls: tuple[str, ...]) -> ServerPool:
            return _open_pool(self, urls)

        def _new_client(self, url: str, group_port: int):
            return _new_client(self, url, group_port)

        def _init_pool(self, pool: ServerPool) -> None:
            """NCCL sync: a weight-transfer group per server, as TRL opens one."""
            pool.init_communicator(self.accelerator.device)

    return DeferredVLLMGeneration


def _open_pool(generation, urls: tuple[str, ...]) -> ServerPool:
    """A client per server (each waited for), behind one pool (train/server_pool.py)."""
    clients = []
    for index, url in enumerate(urls):
        wait_for_server(url, generation.server_timeout)
        clients.append(generation._new_client(url, group_port_of(generation.group_port, index)))
    event = functools.partial(emit, generation.run_dir) if generation.run_dir else None
    pool = ServerPool(clients, generation.server_timeout, *([event] if event else []))
    generation._init_pool(pool)
    return pool


def _new_client(generation, url: str, group_port: int):
    from trl.generation.vllm_client import VLLMClient  # TRL is slow to import

    # The run's token goes to the servers the launcher started, not to a server of
    # vllm_server_base_url (started elsewhere, which has no use for it).
    ours = generation.server_base_url is None
    kind = authorized_client_class() if ours else VLLMClient
    return kind(base_url=url, group_port=group_port, connection_timeout=generation.server_timeout)
