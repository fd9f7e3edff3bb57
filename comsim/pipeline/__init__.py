"""The orchestrator: the stages of a run, and the commands that run them in order.

    stages.py      one function per stage (record, twin, translator, generate, convert, metrics, mix)
    run.py         `comsim run`: the loop on a real recording (no closed-loop experiment: no robot here)
    demo.py        `comsim demo`: the lab's recording + `comsim run` + the policy experiment
    experiment.py  the policy experiment: arms, panels, claim (its datasets made by stages.py)
    mix.py         real + synthetic episodes in one LeRobot dataset at a chosen synthetic fraction

Everything below the orchestrator (twin, translator, factory, convert, metrics, policy, lab) works
on the folders it is given; only this package knows the order of a run.
"""
