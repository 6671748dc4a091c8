"""verl 0.9.1's real ``PPOTrainerSync.fit()`` (v1 trainer, sync mode) for a few GRPO
steps on the CPU, observed by twinkle, for tests/integrations/test_verl.py (run it with
.venv-verl's python: ``_verl_job.py OUT [STEPS] [FAIL_AT]``).

Real: verl's Hydra configuration (``verl/trainer/config/ppo_trainer.yaml``), Ray (local),
TransferQueue (its controller and storage actors), RLHFDataset and its dataloader, the
``fit()`` loop with its timers and hooks, batch balancing, GRPO advantages,
``_compute_metrics``, ``Tracking`` with the ``twinkle`` backend beside ``console``, and
``TaskRunner.run()``'s end (``Tracking.finish``). A Ray actor started with verl's
``worker_process_setup_hook`` override shows ``install()`` running in a worker.

Replaced, because they need GPUs: the actor/reference worker group (FSDP engines), the
rollout (LLM servers and agent-loop workers), the weight sync (CheckpointEngineManager)
and the reward-loop workers. The stand-ins write to and read from the real TransferQueue
the fields the real ones do. ``FAIL_AT``: the actor update raises at that step.

Prints one JSON line: verl's logged figures per step and what the hook did.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np
import ray
import torch
import transfer_queue as tq
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.utils.config import validate_config
from verl.utils.profiler import performance
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.utils.tracking import Tracking

from twinkle.cluster import init_ray
from twinkle.integrations.verl import install

HOOK = "twinkle.integrations.verl.install"
rng = np.random.default_rng(0)
FAIL_AT = int(sys.argv[3]) if len(sys.argv) > 3 else 0


def write_assets(out: str) -> None:
    """A tiny tokenizer, a Qwen2 config.json and prompt parquet files (no hub)."""
    import pandas as pd
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    words = [f"w{i}" for i in range(200)] + [str(i) for i in range(100)]
    words += ["what", "is", "plus", "?", "user", "assistant", "system", ":"]
    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # (transformers: unannotated)
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
    )
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    tok.save_pretrained(f"{out}/model")
    Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=0,
        architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(f"{out}/model")
    for split, n in (("train", 64), ("val", 8)):
        rows = [
            {
                "data_source": "toy_add",
                "prompt": [{"role": "user", "content": f"what is {i % 50} plus {3 * i % 50} ?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(i % 50 + 3 * i % 50)},
                "extra_info": {"index": i, "split": split},
            }
            for i in range(n)
        ]
        pd.DataFrame(rows).to_parquet(f"{out}/{split}.parquet")


def verl_config(assets: str, steps: int) -> DictConfig:
    """verl's own configuration (its Hydra files), with the overrides of a verl user."""
    overrides = [
        f"actor_rollout_ref.model.path={assets}/model",
        f"data.train_files={assets}/train.parquet",
        f"data.val_files={assets}/val.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.resume_mode={os.environ.get('VERL_RESUME_MODE', 'disable')}",
        "trainer.logger=[console,twinkle]",
        "trainer.project_name=verl_cpu",
        "trainer.experiment_name=fit_cpu",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={HOOK}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    return config


class FakeAgentLoopManager:
    """Stands in for AgentLoopManagerTQ + AgentLoopWorkerTQ + LLM servers + reward loop.

    Writes, per prompt uid and per rollout.n session, what AgentLoopWorkerTQ._agent_loop_postprocess
    writes (fields + tags), and the uid status tags of _run_prompt. As the real manager
    dispatches the batch and returns, the stand-in generates when the trainer waits for
    the samples (``gen``: the replay buffer's ``sample``; see ``generates_when_sampled``).
    """

    def __init__(self, config: DictConfig, tokenizer: Any) -> None:
        self.config, self.tok = config, tokenizer
        self.pending: list[TensorDict] = []

    def generate_sequences(self, batch: TensorDict) -> None:
        self.pending.append(batch)

    def generates_when_sampled(self, replay_buffer: Any) -> None:
        sample = replay_buffer.sample

        def generated_then_sampled(*args: Any, **kwargs: Any) -> Any:
            while self.pending:
                self.generate(self.pending.pop(0))
            return sample(*args, **kwargs)

        replay_buffer.sample = generated_then_sampled

    def generate(self, batch: TensorDict) -> None:
        n = self.config.actor_rollout_ref.rollout.n
        gs = batch["global_steps"]
        gs = gs.data if isinstance(gs, NonTensorData) else gs
        for i in range(len(batch)):
            prompt = {}
            for k, v in batch.items():
                if isinstance(v, torch.Tensor):
                    prompt[k] = v[i]
                elif isinstance(v, NonTensorStack):
                    prompt[k] = v[i].data
                elif isinstance(v, NonTensorData):
                    prompt[k] = v.data
            uid = prompt["uid"]
            tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
            text = self.tok.apply_chat_template(
                prompt["raw_prompt"], tokenize=False, add_generation_prompt=True
            )
            prompt_ids = self.tok(text)["input_ids"]
            keys, fields, tags = [], [], []
            for s in range(n):
                rlen = int(rng.integers(3, 16))
                resp = [int(x) for x in rng.integers(4, len(self.tok) - 1, size=rlen)]
                resp[-1] = self.tok.eos_token_id
                score = float(rng.random() < 0.5)
                prompts_t = torch.tensor(prompt_ids, dtype=torch.int64)
                resp_t = torch.tensor(resp, dtype=torch.int64)
                input_ids = torch.cat([prompts_t, resp_t])
                rm = torch.zeros(rlen, dtype=torch.float32)
                rm[-1] = score
                field = dict(prompt)
                field.update(
                    prompts=prompts_t,
                    responses=resp_t,
                    response_mask=torch.ones(rlen, dtype=torch.int64),
                    loss_mask=torch.ones(rlen, dtype=torch.int64),
                    rm_scores=rm,
                    rollout_log_probs=-torch.rand(
                        rlen
                    ),  # rollout.calculate_log_probs=True (default)
                    input_ids=input_ids,
                    position_ids=torch.arange(len(input_ids)),
                    num_turns=2,
                    session_id=s,
                    extra_fields={
                        "min_global_steps": gs - 1,
                        "max_global_steps": gs - 1,
                        "reward_extra_info": {"acc": score},
                    },
                )
                keys.append(f"{uid}_{s}_0")
                fields.append(field)
                tags.append(
                    {
                        "status": "success",
                        "prompt_len": len(prompt_ids),
                        "response_len": rlen,
                        "seq_len": len(prompt_ids) + rlen,
                        "global_steps": gs,
                        "min_global_steps": gs - 1,
                        "max_global_steps": gs - 1,
                    }
                )
            tq.kv_batch_put(
                keys=keys,
                fields=list_of_dict_to_tensordict(fields),
                tags=tags,
                partition_id="train",
            )
            tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})


class FakeActorRolloutRefWG:
    """Stands in for the RayWorkerGroup of ActorRolloutRefWorker (FSDP engine on GPUs).

    compute_log_prob / compute_ref_log_prob write `log_probs`/`entropy` over the whole sequence
    (as the engine does); update_actor runs real optimizer steps (one per PPO mini-batch, as
    BaseEngine.train_batch does) on a tiny CPU model and returns the engine's metrics shape.
    """

    def __init__(self, config: DictConfig) -> None:
        self.config = config
        self._dispatch_info = {"actor": [0]}  # dp_size = 1
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(512, 16), torch.nn.Linear(16, 512))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.optimizer_steps = 0

    def _query_dispatch_info(self, role: str) -> list[int]:
        return [0]

    def _log_probs(self, batch: Any) -> Any:  # (TransferQueue's batch metadata)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"]
        )
        ids = data["input_ids"]
        lp, ent = [], []
        with torch.no_grad():
            for seq in ids.unbind():
                logits = self.model(seq)
                logp = torch.log_softmax(logits, -1)
                lp.append(logp.gather(-1, torch.roll(seq, -1).unsqueeze(-1)).squeeze(-1))
                ent.append(-(logp.exp() * logp).sum(-1))
        out = TensorDict(
            {
                "log_probs": torch.nested.as_nested_tensor(lp, layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor(ent, layout=torch.jagged),
            },
            batch_size=len(batch),
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
        return batch

    def compute_log_prob(self, batch: Any) -> Any:
        return self._log_probs(batch)

    compute_ref_log_prob = compute_log_prob

    def update_actor(self, batch: Any) -> dict[str, Any]:
        self.updates = getattr(self, "updates", 0) + 1
        if self.updates == FAIL_AT:
            raise RuntimeError(f"the actor update of step {FAIL_AT} ran out of memory")
        mb = batch.extra_info["mini_batch_size"]
        epochs = batch.extra_info["epochs"]
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["input_ids", "advantages"],
        )
        seqs, advs = data["input_ids"].unbind(), data["advantages"].unbind()
        metrics: dict[str, Any] = {
            "pg_loss": [],
            "grad_norm": [],
            "lr": None,
            "mfu": [],
            "loss": [],
        }
        for _ in range(epochs):
            for start in range(0, len(seqs), mb):
                self.optim.zero_grad()
                loss = torch.zeros(())  # (a tensor, as the sum of the losses below is)
                for seq, adv in zip(seqs[start : start + mb], advs[start : start + mb]):
                    logp = torch.log_softmax(self.model(seq), -1)
                    tok_lp = logp.gather(-1, torch.roll(seq, -1).unsqueeze(-1)).squeeze(-1)[
                        -len(adv) - 1 : -1
                    ]
                    loss = loss - (tok_lp * adv).mean() / mb
                loss.backward()  # type: ignore[no-untyped-call]  # (torch leaves it unannotated)
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optim.step()
                self.optimizer_steps += 1
                metrics["pg_loss"].append(float(loss))
                metrics["loss"].append(float(loss))
                metrics["grad_norm"].append(float(gn))
                metrics["mfu"].append(0.0)
        metrics["lr"] = self.optim.param_groups[0]["lr"]
        return {"metrics": metrics}


class FakeCheckpointManager:
    """Stands in for CheckpointEngineManager (trainer -> rollout weight sync)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | int, ...]] = []

    def update_weights(self, global_steps: int) -> None:
        self.calls.append(("update_weights", global_steps))

    def sleep_replicas(self) -> None:
        self.calls.append(("sleep_replicas",))


class FakeRewardLoopManager:
    # non-None handles => rewards were streamed by the agent loop (skip colocated 'reward' phase)
    reward_loop_worker_handles: tuple[()] = ()


class LoggedSteps:
    """verl's figures per step, as every backend gets them (a backend of the test's own)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.steps.append(
            {"step": step, **{k: v for k, v in data.items() if isinstance(v, int | float)}}
        )

    def finish(self) -> None:
        pass


class HookedWorker:
    def installed(self) -> bool:
        return "twinkle" in Tracking.supported_backend


hooked_worker = ray.remote(HookedWorker)  # (as @ray.remote makes it: the actor class)


def main(out: str, steps: int) -> None:
    assets = os.path.join(out, "assets")
    write_assets(assets)
    config = verl_config(assets, steps)
    # verl's run_ppo passes ray_kwargs.ray_init to ray.init: its runtime_env's hook runs
    # install() in every worker, as on a cluster
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init)
    env = {"TRANSFER_QUEUE_ENABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runtime_env = {**ray_init["runtime_env"], "env_vars": env}
    init_ray(num_cpus=2, include_dashboard=False, runtime_env=runtime_env)
    worker: Any = hooked_worker.remote()  # (Ray types its methods as plain ones)
    hooked = ray.get(worker.installed.remote())
    verl_timer = performance._timer
    install()  # (this driver runs the trainer itself, where TaskRunner is a Ray worker)
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    tq.init(config.transfer_queue)
    succeeded, trainer, logged = False, None, LoggedSteps()
    error = None
    try:
        trainer = trainer_cls(config=config)
        trainer._init_tokenizer()
        trainer._init_dataloader()
        trainer._init_dump_executor()
        trainer._init_resource_pool_mgr()
        trainer.ref_in_actor = False
        trainer.actor_rollout_wg = FakeActorRolloutRefWG(config)
        trainer.ref_policy_wg = trainer.actor_rollout_wg
        trainer.reward_loop_manager = FakeRewardLoopManager()
        trainer.teacher_model_manager = None
        trainer.distillation_config = None
        trainer.llm_server_manager = None
        trainer.checkpoint_manager = FakeCheckpointManager()
        trainer.checkpoint_manager.sleep_replicas()
        trainer._load_checkpoint()
        trainer.on_init_end()
        original_fit_tracking = Tracking.__init__

        def with_test_backend(self: Any, *args: Any, **kwargs: Any) -> None:
            original_fit_tracking(self, *args, **kwargs)
            self.logger["test"] = logged

        Tracking.__init__ = with_test_backend
        agent_loop_manager = FakeAgentLoopManager(config, trainer.tokenizer)
        agent_loop_manager.generates_when_sampled(trainer.replay_buffer)
        trainer.fit(agent_loop_manager)
        succeeded = True
    except RuntimeError as exc:
        error = str(exc)
    finally:  # verl's TaskRunner.run() ends so
        try:
            tracking = getattr(trainer, "logger", None)
            if tracking is not None:
                tracking.finish(exit_code=0 if succeeded else 1)
        finally:
            tq.close()
    ray.shutdown()
    restored = performance._timer is verl_timer and "_compute_metrics" not in vars(trainer)
    said = {"hooked": hooked, "restored": restored, "logged": logged.steps, "error": error}
    print(json.dumps(said))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
