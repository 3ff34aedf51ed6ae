"""The deterministic simulation of the whole shuffle protocol: the real workers stepped one
step at a time against injected faults (``simulation.py``; the job and its oracle in
``model.py``, faults in ``faults.py``, composite steps in ``steps.py``, invariants in
``checks.py``), the hypothesis machines that drive it (``machines.py``) and the broken
workers it must catch (``mutants.py``). A failure report's replay line runs here:
``from tests.support.simulation import SimConfig, replay``."""

from tests.support.simulation.faults import COMMIT_FAULTS, NET_FAULTS
from tests.support.simulation.simulation import Outcome, SimConfig, Simulation, replay
from tests.support.simulation.steps import Action

__all__ = [
    "COMMIT_FAULTS",
    "NET_FAULTS",
    "Action",
    "Outcome",
    "SimConfig",
    "Simulation",
    "replay",
]
