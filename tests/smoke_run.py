"""A short run through t5nb's whole stack: fine-tune the profile's QA task for 4 steps, decode and
score its validation examples, then resume the run to step 8 from its checkpoint.

    python tests/smoke_run.py [PROFILE]     # default: ci

tests/test_hosted_path.py runs it on Kaggle's TPU stack under `rehearsal` (its layers scanned, on
8 simulated devices, the real tasks read from their stand-ins): what that runtime's accelerators run."""
import math
import sys

import t5nb
from t5nb import workflow

profile = t5nb.get_profile(sys.argv[1] if len(sys.argv) > 1 else "ci")
trainer, first, metrics = workflow.finetune_and_evaluate(profile, profile.qa_task, None, "smoke", num_steps=4)
_, resumed = workflow.finetune(profile, profile.qa_task, None, num_steps=8, name="smoke", progress=False)
assert all(math.isfinite(entry["loss"]) for entry in first.history + resumed.history)
assert 0 <= metrics["em"] <= 100, metrics
print("scanned layers", trainer.model_config.scan_layers, "devices", trainer.mesh.devices.size)
print("steps", int(first.state.step), int(resumed.state.step), "em", metrics["em"])
