"""The life of a run directory, shared by every algorithm's CLI (`python -m jaxrl_hier.train`).

    process.py     is_primary, sync_processes, from_primary, init_distributed: who writes, barriers,
                   process 0's decision for all, multi-host start-up
    directory.py   resolve_output_dir, refuse_existing_run, check_resume_changes, load_saved_config,
                   save_run_config, RunConfigFile: where a run goes, whether it may (re)start there,
                   its config.yaml (a resume's written only after its checkpoint is restored)
    progress.py    log, progress_bar: status lines and the progress bar (a context manager), from
                   process 0 only
    compile_cache.py  use_compilation_cache: XLA's persistent compilation cache in RUN/xla_cache, so a
                   resumed run loads its programs rather than compiling them again
    resumable.py   ResumableRun: checkpoints and metrics.jsonl kept in step, the loop skeleton of a run
    stage.py       stage_summary, seal_stage, run_params_stage: stages of a run sealed by a DONE file
                   (SFT warm-starts, PGTS's reward model, verifier and imitation)

Importing this package is cheap (no jax, no Orbax), so a CLI can check its input and exit 2 first.
"""

from jaxrl_hier.runs.compile_cache import use_compilation_cache
from jaxrl_hier.runs.directory import (RUN_FILES, RunConfigFile, check_resume_changes, load_saved_config,
                                       refuse_existing_run, resolve_output_dir, save_run_config)
from jaxrl_hier.runs.process import from_primary, init_distributed, is_primary, sync_processes
from jaxrl_hier.runs.progress import log, progress_bar
from jaxrl_hier.runs.resumable import ResumableRun
from jaxrl_hier.runs.stage import run_params_stage, seal_stage, stage_summary

__all__ = ["RUN_FILES", "ResumableRun", "RunConfigFile", "check_resume_changes", "from_primary", "init_distributed",
           "is_primary", "load_saved_config", "log", "progress_bar", "refuse_existing_run", "resolve_output_dir",
           "run_params_stage", "save_run_config", "seal_stage", "stage_summary", "sync_processes",
           "use_compilation_cache"]
