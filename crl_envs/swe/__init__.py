"""SWE-bench style tasks: real repositories, shell actions in a sandbox, SWE-bench grading."""
