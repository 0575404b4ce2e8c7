"""Configuration: TOML file, environment overrides, secrets, and errors that name file, key and reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from procurd.config import ConfigError, find_config_file, load_settings
from procurd.core.addresses import private_url_reason

MINIMAL = """
[[upstreams]]
name = "main"
base_url = "https://up.example.com"
api_key = "key-1"
api_secret = "secret-value-1"
"""


def write(tmp_path: Path, text: str, name: str = "procurd.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_file_gets_documented_defaults(tmp_path: Path) -> None:
    """A file with one upstream loads, and every other key takes its documented default."""
    settings = load_settings(write(tmp_path, MINIMAL), environ={})
    assert settings.database.url == "sqlite+aiosqlite:///procurd.db"
    assert (settings.server.public_port, settings.server.admin_port) == (8080, 8081)
    upstream = settings.upstream("main")
    assert upstream.header_prefix == "Service"
    assert upstream.timeout_seconds == 15
    assert upstream.api_root == "https://up.example.com/api/v1/upstream"
    assert upstream.secret() == "secret-value-1"
    assert settings.procurement.max_attempts == 6
    assert settings.source == tmp_path / "procurd.toml"


def test_example_config_is_valid() -> None:
    """config.example.toml, which documents every key, loads without error."""
    example = Path(__file__).parent.parent / "config.example.toml"
    settings = load_settings(example, environ={})
    assert settings.upstreams[0].name == "main"


def test_environment_overrides_sections_and_upstreams(tmp_path: Path) -> None:
    """PROCURD_<SECTION>__<KEY> overrides the file; upstream blocks are addressed by name or index."""
    environ = {
        "PROCURD_DATABASE__URL": "postgresql+asyncpg://u@localhost/db",
        "PROCURD_PROCUREMENT__WORKERS": "3",
        "PROCURD_CATALOG__SYNC_INTERVAL_SECONDS": "0.5",
        "PROCURD_UPSTREAMS__MAIN__API_SECRET": "from-env-secret",
        "PROCURD_UPSTREAMS__0__TIMEOUT_SECONDS": "2.5",
    }
    settings = load_settings(write(tmp_path, MINIMAL), environ=environ)
    assert settings.database.url == "postgresql+asyncpg://u@localhost/db"
    assert settings.procurement.workers == 3
    assert settings.catalog.sync_interval_seconds == 0.5
    assert settings.upstream("main").secret() == "from-env-secret"
    assert settings.upstream("main").timeout_seconds == 2.5


def test_environment_can_add_an_upstream(tmp_path: Path) -> None:
    """An upstream block named only in the environment is added to the file's blocks."""
    environ = {
        "PROCURD_UPSTREAMS__SECOND__BASE_URL": "https://two.example.com",
        "PROCURD_UPSTREAMS__SECOND__API_KEY": "key-2",
        "PROCURD_UPSTREAMS__SECOND__API_SECRET": "secret-value-2",
    }
    settings = load_settings(write(tmp_path, MINIMAL), environ=environ)
    assert [u.name for u in settings.upstreams] == ["main", "second"]


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--config wins over $PROCURD_CONFIG, which wins over ./procurd.toml."""
    explicit = write(tmp_path, MINIMAL, "explicit.toml")
    from_env = write(tmp_path, MINIMAL, "env.toml")
    write(tmp_path, MINIMAL)
    monkeypatch.chdir(tmp_path)
    assert find_config_file(explicit, {"PROCURD_CONFIG": str(from_env)}) == explicit
    assert find_config_file(None, {"PROCURD_CONFIG": str(from_env)}) == from_env
    assert find_config_file(None, {}) == Path("procurd.toml")


def test_secret_file_is_read_and_stripped(tmp_path: Path) -> None:
    """api_secret_file replaces api_secret; the value is stripped of surrounding white space."""
    (tmp_path / "main.secret").write_text("  file-secret-1\n", encoding="utf-8")
    text = MINIMAL.replace('api_secret = "secret-value-1"', f'api_secret_file = "{tmp_path / "main.secret"}"')
    assert load_settings(write(tmp_path, text), environ={}).upstream("main").secret() == "file-secret-1"


def test_secret_file_relative_to_systemd_credentials(tmp_path: Path) -> None:
    """A bare api_secret_file name is looked up in $CREDENTIALS_DIRECTORY (systemd LoadCredential=)."""
    (tmp_path / "main").write_text("cred-secret-1", encoding="utf-8")
    text = MINIMAL.replace('api_secret = "secret-value-1"', 'api_secret_file = "main"')
    settings = load_settings(write(tmp_path, text), environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert settings.upstream("main").secret() == "cred-secret-1"


def test_token_and_webhook_secret_files(tmp_path: Path) -> None:
    """admin_token_file and webhook_secret_file are read like api_secret_file: bare names from
    $CREDENTIALS_DIRECTORY, stripped of white space."""
    (tmp_path / "admin").write_text("admin-token-1\n", encoding="utf-8")
    (tmp_path / "webhook").write_text(" webhook-secret-1 ", encoding="utf-8")
    text = MINIMAL + (
        '\n[server]\nadmin_host = "0.0.0.0"\nadmin_token_file = "admin"\n'
        '\n[storefront]\nwebhook_url = "https://shop.example.com/events"\nwebhook_secret_file = "webhook"\n'
    )
    settings = load_settings(write(tmp_path, text), environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert settings.server.admin_token.get_secret_value() == "admin-token-1"
    assert settings.storefront.webhook_secret.get_secret_value() == "webhook-secret-1"


def test_bare_names_beside_the_configuration_file(tmp_path: Path) -> None:
    """Outside systemd a bare secret file name is read from the credentials directory beside the file."""
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials" / "main").write_text("beside-secret-1", encoding="utf-8")
    text = MINIMAL.replace('api_secret = "secret-value-1"', 'api_secret_file = "main"')
    assert load_settings(write(tmp_path, text), environ={}).upstream("main").secret() == "beside-secret-1"


def test_secret_files_are_left_alone_unless_asked(tmp_path: Path) -> None:
    """Without read_secret_files a missing secret file is no error; the secret is simply not there."""
    text = MINIMAL.replace('api_secret = "secret-value-1"', 'api_secret_file = "/nonexistent/secret"')
    settings = load_settings(write(tmp_path, text), environ={}, read_secret_files=False)
    with pytest.raises(RuntimeError, match="api_secret_file was not read"):
        settings.upstream("main").secret()


def test_environment_variables_without_a_section_are_ignored(tmp_path: Path) -> None:
    """PROCURD_ variables without ``__`` are not configuration; those with one are, and a bad value names
    the variable."""
    environ = {"PROCURD_VENV": "/x", "PROCURD_CRASH_SEED": "3", "PROCURD_CONFIG_EXTRA": "y"}
    assert load_settings(write(tmp_path, MINIMAL), environ=environ).upstream("main").secret()
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL), environ={"PROCURD_CATALOG__PAGE_SIZE": "many"})
    expected = "environment variable PROCURD_CATALOG__PAGE_SIZE: [catalog] page_size:"
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (MINIMAL + "\n[server]\nbogus = 1\n", "[server] bogus: unknown key"),
        (MINIMAL + "\n[server]\npublic_port = 'eighty'\n", "[server] public_port:"),
        (MINIMAL + "\n[server]\npublic_port = 70000\n", "[server] public_port:"),
        (MINIMAL.replace('api_secret = "secret-value-1"', ""), "upstreams[0] (main): api_secret: missing"),
        (MINIMAL.replace('base_url = "https://up.example.com"', 'base_url = "ftp://x"'), "base_url"),
        (MINIMAL + '\n[server]\nadmin_host = "0.0.0.0"\n', "admin_token: required"),
        (MINIMAL + '\n[logging]\nlevel = "loud"\n', "[logging] level:"),
        (MINIMAL + '\n[database]\nurl = "mysql://x"\n', "[database] url:"),
        ("[server]\n", "upstreams: required key is missing"),
        (MINIMAL + MINIMAL, "upstreams: upstream name 'main' is used more than once"),
        (MINIMAL + "\n[procurement]\nretry_base_seconds = -1\n", "[procurement] retry_base_seconds:"),
        (MINIMAL + "\n[server]\npublic_port = 9000\nadmin_port = 9000\n", "[server] admin_port: 9000 is"),
        ("[[upstreams]\n", "not valid TOML"),
    ],
)
def test_errors_name_file_key_and_reason(tmp_path: Path, change: str, expected: str) -> None:
    """Every kind of mistake is reported with the file, the key and the reason."""
    path = write(tmp_path, change)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_a_threshold_written_as_a_whole_number_is_its_decimal_text(tmp_path: Path) -> None:
    """``low_balance_threshold = 100`` (a TOML integer, exact) is the amount "100", at an upstream and for
    the provider; a number with a fraction (a binary float) is refused with the string to write instead."""
    whole = MINIMAL + "low_balance_threshold = 100\n[provider]\nlow_balance_threshold = 25\n"
    settings = load_settings(write(tmp_path, whole), environ={})
    assert settings.upstream("main").low_balance_threshold == "100"
    assert settings.provider.low_balance_threshold == "25"
    fraction = MINIMAL + "[provider]\nlow_balance_threshold = 100.5\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, fraction), environ={})
    assert str(caught.value) == (
        f"{tmp_path / 'procurd.toml'}: [provider] low_balance_threshold: must be a decimal string such as "
        '"100.50": a number with a fraction is read as a binary float, which cannot hold every amount exactly'
    )


def test_missing_secret_file_is_named(tmp_path: Path) -> None:
    """A secret file that does not exist is reported by key and path."""
    text = MINIMAL.replace('api_secret = "secret-value-1"', 'api_secret_file = "/nonexistent/secret"')
    with pytest.raises(ConfigError, match=r"api_secret_file: file /nonexistent/secret not found"):
        load_settings(write(tmp_path, text), environ={})


def test_errors_never_show_secret_values(tmp_path: Path) -> None:
    """An error in a block that holds a secret does not print the secret."""
    text = MINIMAL + "\n[server]\nadmin_token = 'super-secret-token'\nadmin_port = 'x'\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert "super-secret-token" not in str(caught.value)
    assert "secret-value-1" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "private"),
    [
        ("https://shop.example.com/cb", False),
        ("http://localhost/cb", True),
        ("http://127.0.0.1:8080/cb", True),
        ("http://[::1]/cb", True),
        ("http://0.0.0.0/cb", True),
        ("http://10.1.2.3/cb", True),
        ("http://192.168.1.1/cb", True),
        ("http://169.254.1.1/cb", True),
        ("http://8.8.8.8/cb", False),
        ("http://0x7f000001/cb", True),
        ("http://127.1/cb", True),
        ("http://①②⑦.０.０.①/cb", True),
        ("http://100.64.0.1/cb", True),
        ("http://[::ffff:10.0.0.1]/cb", True),
        ("http://[2002:c0a8:101::]/cb", True),
        ("http://[2002:808:808::]/cb", False),
        ("http://[2606:4700::1111]/cb", False),
        ("http://例え.テスト/cb", False),
        ("http://shop.example.com./cb", False),
        ("http://[::1/cb", True),
    ],
)
def test_private_callback_urls_are_recognised(url: str, private: bool) -> None:
    """The same hosts an upstream refuses as callback address are recognised as private, and so are
    addresses in a shorthand or numeric form, whatever they stand for; public addresses (6to4 of a public
    IPv4 address included) and DNS names, international ones included, are not (names are not resolved)."""
    assert (private_url_reason(url) is not None) is private


def test_cli_exits_2_with_message_and_no_traceback(tmp_path: Path) -> None:
    """The program stops with exit code 2 and a one-line reason per problem, never a traceback."""
    path = write(tmp_path, MINIMAL + "\n[server]\nbogus = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "procurd", "--config", str(path), "db", "upgrade"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"{path}: [server] bogus: unknown key" in result.stderr
    assert "Traceback" not in result.stderr
