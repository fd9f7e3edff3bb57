"""Data factory: scripted experts built from primitives mass-produce simulated episodes.

    program = load_program("stack")            # configs/tasks/stack.yaml, checked line by line
    report = generate_dataset("stack", episodes=200, out="data/sim_stack", workers=2)

- ``program.py``   task YAML -> TaskProgram (errors name file:line)
- ``primitives.py`` move, grasp, lift, place, stack, release, push, wait, home
- ``layout.py``    one episode's world from its seed (poses ID/OOD, instances, distractors)
- ``success.py``   predicates on the final sim state
- ``expert.py``    IK vetting of a layout, running a program, recording the episode
- ``generate.py``  parallel, resumable dataset generation and its report
- ``demos.py``     source demonstrations from a paired dataset: replayed in the twin, segmented
- ``demo_derived.py`` their segments moved onto new layouts (MimicGen-style), `--from-demos`
  (``from comsim.factory.demo_derived import generate_from_demos``: not imported here, it needs the twin)
"""
from comsim.factory.generate import generate_dataset
from comsim.factory.program import ProgramError, TaskProgram, load_program

__all__ = ["ProgramError", "TaskProgram", "generate_dataset", "load_program"]
