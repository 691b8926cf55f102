"""Copy of the eat_cow run with the defeat_zombie expert (trained alone) added as skill 15, and the
manager stage cleared, its skill list extended by defeat_zombie."""
import json, shutil, sys
from pathlib import Path
src, zombie, dst = Path("/work/runs/classic_seed0_cow"), Path("/work/runs/zombie"), Path("/work/runs/cow_zombie")
if dst.exists():
    shutil.rmtree(dst)
shutil.copytree(src, dst)
shutil.rmtree(dst / "manager"); shutil.rmtree(dst / "eval")
zstate = json.loads((zombie / "scheduler_state.json").read_text())
(rec,) = zstate["skills"]
assert rec["name"] == "defeat_zombie" and rec["status"] == "completed", rec["status"]
state = json.loads((dst / "scheduler_state.json").read_text())
new_id = max(r["id"] for r in state["skills"]) + 1
rec = {**rec, "id": new_id}
state["skills"].append(rec)
state["manager"] = {}
(dst / "scheduler_state.json").write_text(json.dumps(state, indent=1))
target = dst / "skills" / f"{new_id:03d}_defeat_zombie"
shutil.copytree(zombie / "skills" / "000_defeat_zombie", target)
spec = json.loads((target / "spec.json").read_text())
for e in spec["expert_index"]:
    e["id"] = new_id
(target / "spec.json").write_text(json.dumps(spec, indent=2))
cfg = (dst / "config.yaml").read_text()
cfg = cfg.replace("  - make_stone_sword\n  option_steps", "  - make_stone_sword\n  - defeat_zombie\n  option_steps")
assert "- defeat_zombie" in cfg
(dst / "config.yaml").write_text(cfg)
print("grafted as", new_id, rec["steps"], rec["success_rate"])
