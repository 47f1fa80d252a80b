"""QL_JOB_* settings parse to typed values, and a bad value is one clear error (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import DEFAULT_JOB_UMASK, JOB_HOME_ROOT, JobUserSettings, Settings


def test_no_job_user_is_the_default_and_means_same_user_jobs() -> None:
    job = Settings.from_env({"QL_DATA_DIR": "/srv/ql"}).job
    assert job == JobUserSettings()
    assert not job.configured
    assert (job.umask, job.home, job.home_root) == (DEFAULT_JOB_UMASK, None, JOB_HOME_ROOT)


def test_job_user_settings_are_read_as_typed_values() -> None:
    job = JobUserSettings.from_env(
        {"QL_JOB_USER": " nobody ", "QL_JOB_USERS": "batch, ,etl,batch", "QL_JOB_UMASK": "027",
         "QL_JOB_HOME": "/var/lib/ql-job", "QL_JOB_HOME_ROOT": "/var/tmp"}
    )  # fmt: skip
    assert job.user == "nobody" and job.allowed == ("batch", "etl") and job.configured
    assert job.umask == 0o027
    assert job.home == Path("/var/lib/ql-job") and job.home_root == Path("/var/tmp")
    assert JobUserSettings.from_env({"QL_JOB_USERS": "batch"}).configured  # run_as alone


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"QL_JOB_UMASK": "99"}, "octal umask"),
        ({"QL_JOB_UMASK": "1777"}, "between 000 and 777"),
        ({"QL_JOB_HOME": "relative/home"}, "QL_JOB_HOME must be an absolute path"),
        ({"QL_JOB_HOME_ROOT": "tmp"}, "QL_JOB_HOME_ROOT must be an absolute path"),
    ],
)
def test_a_bad_job_setting_is_refused_with_its_name(env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        JobUserSettings.from_env(env)
