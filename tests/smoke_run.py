"""A short run through t5nb's whole stack: fine-tune facts_qa with the ci profile for 4 steps,
decode and score its validation examples, then resume the run to step 8 from its checkpoint.
tests/test_hosted_path.py runs it on Colab's own versions of jax, flax, orbax and tensorflow."""
import math

import t5nb
from t5nb import workflow

profile = t5nb.get_profile("ci")
_, first, metrics = workflow.finetune_and_evaluate(profile, profile.qa_task, None, "smoke", num_steps=4)
_, resumed = workflow.finetune(profile, profile.qa_task, None, num_steps=8, name="smoke", progress=False)
assert all(math.isfinite(entry["loss"]) for entry in first.history + resumed.history)
assert 0 <= metrics["em"] <= 100, metrics
print("steps", int(first.state.step), int(resumed.state.step), "em", metrics["em"])
