"""An export folder pushed to the Hugging Face Hub, its README.md as the model card (private by default)."""

from __future__ import annotations

from pathlib import Path

from art_agents.server.export.source import ExportError


def push_to_hub(folder: Path, repo: str, *, private: bool = True, message: str | None = None) -> str:
    """Create `repo` (if new) and upload `folder` to it in one commit; returns the commit's URL.

    The token is huggingface_hub's usual one: `HF_TOKEN`, else the one `hf auth login` saved.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=folder, repo_id=repo, repo_type="model", commit_message=message or f"Upload {folder.name}"
        )
    except OfflineModeIsEnabled as exc:
        raise ExportError(f"pushing to {repo} needs the Hub, but HF_HUB_OFFLINE is set; unset it and rerun") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        fix = "set HF_TOKEN to a token with write access" if status in (401, 403) else "check the repo name and rerun"
        raise ExportError(f"pushing {folder} to {repo} failed ({status}: {str(exc).splitlines()[0]}); {fix}") from exc
    return str(commit.commit_url)
