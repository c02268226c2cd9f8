"""The config's ``web`` section: validation, the allow-list's matching, which clones get the web
tools by default, and that an untrusted project's config may not set it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from clonefleet.config import Config, WebConfig, domain_allowed, load_config, web_change
from clonefleet.definitions import load_file
from clonefleet.errors import ConfigError
from clonefleet.planning import resolve_tools
from clonefleet.vocab import WEB_TOOLS, WORK_TOOLS

pytestmark = pytest.mark.timeout(20)


def test_domains_are_normalised_and_matched_exactly_or_as_subdomains():
    web = WebConfig(allow_domains=["Docs.Python.org.", "*.Example.com", "127.0.0.1", "[::1]"])
    assert web.allow_domains == ("docs.python.org", "*.example.com", "127.0.0.1", "::1")
    allow = web.allow_domains
    assert domain_allowed("docs.python.org", allow) and domain_allowed("DOCS.python.org.", allow)
    assert domain_allowed("a.example.com", allow) and domain_allowed("a.b.example.com", allow)
    assert not domain_allowed("example.com", allow)  # the wildcard covers subdomains only
    assert not domain_allowed("badexample.com", allow)
    assert not domain_allowed("python.org", allow)
    assert domain_allowed("::1", allow) and not domain_allowed("127.0.0.2", allow)


@pytest.mark.parametrize(
    "entry", ["https://a.com", "a.com/path", "a.com:80", "*", "*.", "a..com", "-a.com", "a b"]
)
def test_an_allow_list_entry_must_be_a_bare_host(entry):
    with pytest.raises(ValidationError, match="is not a host name"):
        WebConfig(allow_domains=[entry])


@pytest.mark.parametrize(
    "fields",
    [
        {"fetch_timeout_s": math.nan},
        {"fetch_timeout_s": math.inf},
        {"fetch_timeout_s": 0},
        {"max_fetch_bytes": 10},
        {"max_fetch_bytes": 10**12},
        {"max_redirects": -1},
        {"max_redirects": 100},
        {"search": {"backend": "http", "url": "http://x/?q=1"}},
        {"search": {"backend": "http", "url": "file:///x?q={query}"}},
        {"search": {"backend": "python", "callable": "not a callable"}},
        {"search": {"backend": "python", "callable": "m:f", "url": "http://x/{query}"}},
        {"search": {"backend": "http", "url": "http://x/{query}", "timeout_s": math.nan}},
        {"search": {"backend": "http", "url": "http://x/{query}", "headers_env": {"A B": "K"}}},
        {"search": {"backend": "bing"}},
        {"surprise": 1},
    ],
)
def test_out_of_range_or_malformed_values_are_refused(fields):
    with pytest.raises(ValidationError):
        Config(web=fields)


def test_the_web_tools_are_on_only_as_far_as_configured():
    assert WebConfig().enabled_tools == frozenset()
    assert WebConfig(allow_domains=["a.com"]).enabled_tools == {"web_fetch"}
    search = {"backend": "python", "callable": "pkg.mod:find"}
    assert WebConfig(search=search).enabled_tools == {"web_search"}


def _definition(folder, text: str):
    (folder / "a.md").write_text(text)
    return load_file(folder / "a.md")


def test_a_definition_without_tools_gets_the_web_tools_only_when_configured(tmp_path):
    everything = _definition(tmp_path, "---\nname: a\ndescription: d\n---\nbody\n")
    without_web = resolve_tools(everything)
    assert set(without_web) & set(WORK_TOOLS) == set(WORK_TOOLS) - set(WEB_TOOLS)
    assert {"todo_write", "notebook_edit", "shell_output", "shell_kill"} <= set(without_web)
    assert "web_fetch" in resolve_tools(everything, None, {"web_fetch"})
    assert "web_search" not in resolve_tools(everything, None, {"web_fetch"})
    # Named in the definition, a web tool is granted (and answers an error until configured).
    named = _definition(
        tmp_path, "---\nname: a\ndescription: d\ntools: Read, WebFetch, TodoWrite\n---\nb\n"
    )
    assert set(resolve_tools(named)) & set(WORK_TOOLS) == {"file_read", "web_fetch", "todo_write"}
    assert not named.warnings


def test_an_untrusted_project_config_may_not_set_web(tmp_path, monkeypatch):
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("CLONEFLEET_CONFIG", raising=False)
    project = tmp_path / "project"
    (project / ".clonefleet").mkdir(parents=True)
    path = project / ".clonefleet" / "config.yaml"
    monkeypatch.chdir(project)
    path.write_text("web: {search: {backend: python, callable: 'evil:run'}}\n")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert (info.value.path, info.value.key) == (str(path), "web.search")
    assert "clonefleet trust" in info.value.message
    path.write_text("web: {}\n")
    with pytest.raises(ConfigError, match="it sets web"):
        load_config()
    path.write_text("limits: {max_depth: 2}\n")
    assert load_config().web == WebConfig() and web_change(load_config()) is None
    # Trusted, the same file loads.
    path.write_text("web: {allow_domains: [docs.python.org]}\n")
    from clonefleet.config import trust_folder

    trust_folder(project)
    assert load_config().web.allow_domains == ("docs.python.org",)
