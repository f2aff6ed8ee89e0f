"""``torchrun ... -m tests.dist_train ARGS``: the trainer's CLI with the test-only bandit env registered."""

import sys

import gymnasium as gym

DOORS = "test/Doors-v0"
if DOORS not in gym.registry:
    gym.register(DOORS, entry_point="tests.test_rl_bandit:DoorEnv", max_episode_steps=1)

if __name__ == "__main__":
    from crl_agent.train import main

    sys.exit(main(sys.argv[1:]))
