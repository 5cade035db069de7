# triton_repo/models/bootstrap.py as the renderer copies it next to each python model (`<model>/1/eagle_bootstrap.py`).
from triton_repo.models.bootstrap import project_on_path as project_on_path
