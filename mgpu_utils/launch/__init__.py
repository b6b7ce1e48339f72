"""Running launch scripts under torchrun from a notebook or a test: the launcher, warm launches, several
torchrun agents as the nodes of one job, and on a cluster: what a script needs there (a shared folder, a
stop before the time limit) and a one-host Slurm to run cluster/slurm/job.sbatch on (lessons 00-12)."""
