"""polar_traj: trajectories from captured calls, written as Parquet."""
