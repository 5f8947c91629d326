# Experiment trackers beside TensorBoard, one switch each, for both stages (`train.trackers` of every config;
# docs/training.md). Off by default; when on, each run (arm x seed x lr scale) is one tracker run, grouped by
# experiment and continued by --resume, and the report is attached to a run of its own. Override on the command
# line, e.g. `train.trackers.wandb.enabled=True` or `train.trackers.mlflow.enabled=True`.
#   wandb:  mode "offline" (no account, no network: files in each run's wandb/ folder for `wandb sync`) or
#           "online"; project, entity (None: the account's default), group (None: the experiment folder's name)
#   mlflow: tracking_uri (None: a SQLite database mlflow.db beside the experiment folder, in its parent folder), or
#           a server / database URI; experiment (None: the experiment folder's name)
# The packages are optional: pip install 'condinit-det[wandb]' / 'condinit-det[mlflow]'.
trackers = dict(
    wandb=dict(enabled=False, project="condinit-det", entity=None, mode="offline", group=None),
    mlflow=dict(enabled=False, tracking_uri=None, experiment=None),
)
