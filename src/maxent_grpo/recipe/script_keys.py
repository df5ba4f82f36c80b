"""The script section of a recipe (`recipe.script`): what to train on and how to score it.

Each field is its key's one declaration (name, type, default, help, choices; a range or a
package in its `Annotated` type: recipe/declare.py). Standard library only: no TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from maxent_grpo.recipe.declare import Accepts

# What an unset reward_funcs trains with when no environment scores its own rollouts.
DEFAULT_REWARD_FUNCS = ("answer_match",)


@dataclass
class ScriptArguments:
    """What to train on and how to score it."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset to train on: a Hugging Face hub id, a local file or directory "
            "(.jsonl, .json, .parquet, .csv), or a built-in dataset that needs no network: "
            "'builtin:arithmetic', 'builtin:word_problems' or 'builtin:mixed'. "
            "Set this or dataset_mixture, not both."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub dataset configuration name (load_dataset's `name`)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on (optional)."}
    )
    dataset_mixture: dict | None = field(
        default=None,
        metadata={
            "help": "A weighted mixture of datasets (YAML only): {datasets: [{id or path, config, "
            "split, columns, weight}, ...], seed, test_split_size}. Each weight is the fraction "
            "of that dataset's rows to keep."
        },
    )
    dataset_prompt_column: str = field(
        default="problem", metadata={"help": "Column holding the user prompt."}
    )
    dataset_answer_column: str = field(
        default="solution",
        metadata={
            "help": "Column holding the reference answer; reward functions receive it as the "
            "`solution` keyword."
        },
    )
    dataset_num_rows: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=4096, metadata={"help": "Rows generated for a built-in dataset."}
    )
    dataset_seed: int = field(
        default=0, metadata={"help": "Seed of the built-in dataset generator."}
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message put before every prompt (none when unset)."},
    )
    prompt_template: str | None = field(
        default=None,
        metadata={
            "help": "Text around each prompt, sent as plain text instead of chat messages (the "
            "tokenizer's chat template is not applied): a template with a {prompt} placeholder "
            "and, when system_prompt is set, a {system} one (literal braces written {{ }}), or "
            "a named one of upstream maxent-grpo: 'r1' (the R1-Zero think/answer prompt), "
            "'qwen_math' (Qwen's step-by-step \\boxed{} prompt), 'no' (the prompt alone). "
            "Unset: chat messages."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: built-in names (accuracy, answer_match, format, tag_count, "
            "length, soft_overlong_punishment, repetition_penalty), 'module:function', a reward "
            "server 'http(s)://host:port/path' or a reward model 'model:<hub id or path>' "
            "(docs/tools.md). "
            "Weights come from reward_weights. Unset: [answer_match], or none when the "
            "environment defines get_reward (its reward alone)."
        },
    )
    reward_timeout_seconds: Annotated[float, Accepts(range=(">=", 0))] = field(
        default=60.0,
        metadata={
            "help": "Time limit of one reward call. A reward function that raises or runs past it "
            "is retried sample by sample; samples that still fail score None (skipped by TRL), "
            "are logged and counted in rewards/<name>/failures (on the steps with failures). 0 "
            "disables the limit."
        },
    )
    reward_server_timeout_seconds: Annotated[float, Accepts(range=(">", 0))] = field(
        default=30.0,
        metadata={
            "help": "Time limit of one request to a reward server (a reward_funcs entry "
            "http(s)://...; docs/tools.md)."
        },
    )
    reward_server_retries: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=2,
        metadata={
            "help": "Retries of a failed reward-server request (refused, timed out, HTTP 5xx), "
            "after pauses of 0.5 s doubling up to 5 s; then the run stops with "
            "RewardServerDown."
        },
    )
    reward_server_token_env: str | None = field(
        default=None,
        metadata={
            "help": "The name of an environment variable (e.g. MY_REWARD_TOKEN) whose value the "
            "trainers send to every reward server as 'Authorization: Bearer <value>', so that "
            "your server can refuse anyone else (docs/security.md). The value stays in the "
            "environment, never in the recipe; a run whose trainers lack the variable stops "
            "at start with one line. Unset: no header."
        },
    )
    tools: list[str] | None = field(
        default=None,
        metadata={
            "help": "Tools the model may call during generation (TRL's tool-calling loop; "
            "docs/tools.md): 'python' (runs the program in the code sandbox, code_sandbox and "
            "code_memory_mb) or 'module:function' (type hints and a docstring with Args:). The "
            "chat template must support tool calls. Turns: max_tool_calling_iterations."
        },
    )
    environment: str | None = field(
        default=None,
        metadata={
            "help": "A class 'module:Class' TRL makes one instance of per rollout "
            "(environment_factory; docs/tools.md): reset(**row) before generation, its public "
            "methods offered as tools (limits: tool_timeout_seconds, tool_output_max_chars), "
            "an optional get_reward() scoring the rollout. Needs chat prompts."
        },
    )
    tool_timeout_seconds: Annotated[float, Accepts(range=(">", 0))] = field(
        default=10.0,
        metadata={"help": "Time limit of one tool call; past it the call is a tool error."},
    )
    tool_output_max_chars: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=2000,
        metadata={
            "help": "A tool's output is cut to this many characters before the model sees it."
        },
    )
    repetition_n_grams: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=3, metadata={"help": "n-gram size of the repetition_penalty reward."}
    )
    repetition_max_penalty: Annotated[float, Accepts(range=("<=", 0))] = field(
        default=-1.0,
        metadata={"help": "Penalty of a fully repetitive completion (repetition_penalty, <= 0)."},
    )
    overlong_max_length: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "Length (tokens) past which soft_overlong_punishment gives -1; defaults to "
            "max_completion_length."
        },
    )
    overlong_buffer: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=256,
        metadata={
            "help": "Soft-punishment band (tokens) before overlong_max_length "
            "(soft_overlong_punishment)."
        },
    )

    cosine_min_value_wrong: float = field(
        default=0.0,
        metadata={"help": "cosine reward of a wrong answer of length 0."},
    )
    cosine_max_value_wrong: float = field(
        default=-0.5,
        metadata={"help": "cosine reward of a wrong answer of length cosine_max_len."},
    )
    cosine_min_value_correct: float = field(
        default=0.5,
        metadata={"help": "cosine reward of a correct answer of length cosine_max_len."},
    )
    cosine_max_value_correct: float = field(
        default=1.0,
        metadata={"help": "cosine reward of a correct answer of length 0."},
    )
    cosine_max_len: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1000,
        metadata={"help": "Length (characters) at which the cosine reward reaches its end values."},
    )
    code_provider: str = field(
        default="local",
        metadata={
            "help": "Where code rewards run programs: 'local' (a sandbox on the training machine; "
            "open-r1's remote providers e2b and morph are refused with one line)."
        },
    )
    code_language: str = field(
        default="python",
        metadata={"help": "Language of the code rewards' programs: python."},
    )
    parallel_code_exec_per_proc: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=2,
        metadata={"help": "Sandboxed programs run at once per training process (code rewards)."},
    )
    code_timeout_seconds: Annotated[float, Accepts(range=(">", 0))] = field(
        default=5.0,
        metadata={"help": "Wall-time limit of one sandboxed program run (code rewards)."},
    )
    code_memory_mb: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1024,
        metadata={"help": "Address-space limit (MiB) of one sandboxed program run (code rewards)."},
    )
    code_sandbox: str = field(
        default="bwrap",
        metadata={
            "help": "Isolation of the code rewards' programs: 'bwrap' (namespaces, an "
            "unprivileged uid, seccomp; refused in one line where bubblewrap cannot run) or "
            "'weak' (an audit hook inside the interpreter, which a determined program escapes; "
            "docs/code-rewards.md).",
            "choices": ["bwrap", "weak"],
        },
    )
    # Evaluation (maxent_grpo.evaluate, docs/evaluation.md).
    benchmarks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Benchmarks that score checkpoints: built-in names ('arithmetic', "
            "'word_problems': held-out generated problems, greedy, accuracy) or, in YAML, "
            "mappings {name, dataset, split, dataset_config, prompt_column, answer_column, "
            "reward, num_examples, num_samples, k, temperature, top_p, max_new_tokens, "
            "pass_threshold, batch_size, seed, system_prompt}. The score is the mean pass@k."
        },
    )
    benchmark_every: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=1,
        metadata={
            "help": "Evaluate every N-th saved checkpoint (0: none during training, only the "
            "final model with benchmark_at_end)."
        },
    )
    benchmark_at_end: bool = field(
        default=True,
        metadata={"help": "Evaluate the final model after the final save."},
    )
    benchmark_mode: str = field(
        default="auto",
        metadata={
            "help": "Where evaluations run: 'slurm' (one evaluation job per checkpoint from "
            "slurm/eval.sbatch; training never waits), 'inline' (in the training job's main "
            "process, after the final save) or 'auto' (slurm inside a Slurm job, else inline).",
            "choices": ["auto", "slurm", "inline"],
        },
    )
    benchmark_backend: str = field(
        default="auto",
        metadata={
            "help": "How evaluations generate: 'vllm' (vLLM's offline engine), 'transformers' "
            "(generate) or 'auto' (vLLM when installed and on a GPU).",
            "choices": ["auto", "vllm", "transformers"],
        },
    )
    benchmark_gpus: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=1, metadata={"help": "GPUs of each evaluation job (benchmark_mode slurm; 0: CPU)."}
    )
    benchmark_cpus: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=8, metadata={"help": "CPUs of each evaluation job (benchmark_mode slurm)."}
    )
    benchmark_time: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=60,
        metadata={"help": "Time limit (minutes) of each evaluation job (benchmark_mode slurm)."},
    )
    benchmark_sbatch_args: list[str] | None = field(
        default=None,
        metadata={
            "help": "More sbatch options for evaluation jobs, e.g. ['--partition=eval', "
            "'--qos=low'] (default: the training job's partition)."
        },
    )

    def tool_settings(self) -> dict[str, Any]:
        """The settings of rewards/tools.py's get_tools."""
        names = ("tool_timeout_seconds", "tool_output_max_chars", "code_memory_mb", "code_sandbox")
        return {name: getattr(self, name) for name in names}

    def reward_settings(self, max_completion_length: int) -> dict[str, Any]:
        """The keyword settings of the parametrised built-in rewards."""
        max_length = self.overlong_max_length or max_completion_length
        return {
            "repetition_n_grams": self.repetition_n_grams,
            "repetition_max_penalty": self.repetition_max_penalty,
            "overlong_max_length": max_length,
            "overlong_buffer": min(self.overlong_buffer, max_length),
            **{name: getattr(self, name) for name in _PASSED_SETTINGS},
        }


# Reward settings that are recipe keys of the same name, passed as they are.
_PASSED_SETTINGS = (
    "cosine_min_value_wrong",
    "cosine_max_value_wrong",
    "cosine_min_value_correct",
    "cosine_max_value_correct",
    "cosine_max_len",
    "code_provider",
    "code_language",
    "parallel_code_exec_per_proc",
    "code_timeout_seconds",
    "code_memory_mb",
    "code_sandbox",
    "reward_server_timeout_seconds",
    "reward_server_retries",
    "reward_server_token_env",
)
