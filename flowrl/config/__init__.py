"""Run configuration: flat pydantic sections, each default documented once.

Bad values fail at load with the dotted field name (`train.batch_size: ...`).
The defaults run the embedded job: the built-in tiny model on the built-in
arithmetic task, on CPU, in a few minutes.
"""

from flowrl.config.sections import (CheckpointConfig, DataConfig, DebugConfig, EvalConfig, ExecutorSection, ModelConfig,
                                    Section, TaskConfig, TrainConfig)
from flowrl.config.moved_keys import MOVED, move_train_keys
from flowrl.config.run_config import LEGACY_JUDGE, LEGACY_SECTIONS, RunConfig, move_legacy_sections
from flowrl.config.loading import format_error, load_run_config, non_finite, read_config_file, set_dotted, validate
from flowrl.config.checks import VLLM_LORA_RANKS, refuse_contradictions, used_sections, warn_no_effect
from flowrl.config.listing import config_lines, section_lines
from flowrl.config.presets import PRESETS, apply_cuda, preset_lines

__all__ = ["CheckpointConfig", "DebugConfig", "EvalConfig", "ExecutorSection", "MOVED", "move_train_keys",
           "DataConfig", "ModelConfig", "Section", "TaskConfig", "TrainConfig", "LEGACY_JUDGE", "LEGACY_SECTIONS",
           "RunConfig", "move_legacy_sections", "format_error", "load_run_config", "non_finite", "read_config_file",
           "set_dotted", "validate", "VLLM_LORA_RANKS", "refuse_contradictions", "used_sections", "warn_no_effect",
           "config_lines", "section_lines", "PRESETS", "apply_cuda", "preset_lines"]
