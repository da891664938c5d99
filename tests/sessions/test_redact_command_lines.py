"""S-4 for command lines: the secrets people write in a shell command — a URL's password,
``--password X``, curl's ``-u user:password``, MySQL's ``-pPASSWORD`` — lose their values, in
a text (shell.exec's ``cmd``) and in an argv alike, while the same options where they mean no
secret (``mkdir -p``, ``docker run -u 1000:1000``) are left alone."""

from __future__ import annotations

import pytest

from cortexfs.shared.redact import REDACTED, summarize, summarize_argv

R = REDACTED


@pytest.mark.parametrize(
    ("command", "logged"),
    [
        ("git clone https://ana:hunter2@git.example/r", f"git clone https://ana:{R}@git.example/r"),
        ("psql postgres://app:s3cr3t@db:5432/app", f"psql postgres://app:{R}@db:5432/app"),
        ("redis-cli -u redis://:hunter2@cache:6379", f"redis-cli -u redis://:{R}@cache:6379"),
        ("mysql --password hunter2 app", f"mysql --password {R} app"),
        ("mysql --password=hunter2 app", f"mysql --password={R} app"),
        ("deploy --passwd hunter2 --token t0k3n", f"deploy --passwd {R} --token {R}"),
        ("deploy --secret 's p' --api-key k3y", f"deploy --secret '{R}' --api-key {R}"),
        ("deploy --api-key=k3y --verbose", f"deploy --api-key={R} --verbose"),
        ("curl -u admin:hunter2 https://h/", f"curl -u admin:{R} https://h/"),
        ("curl --user admin:hunter2 https://h/", f"curl --user admin:{R} https://h/"),
        ("curl --user=admin:hunter2 https://h/", f"curl --user=admin:{R} https://h/"),
        ("curl -uadmin:hunter2 https://h/", f"curl -uadmin:{R} https://h/"),
        ("curl -su 'admin:p w' https://h/", f"curl -su 'admin:{R}' https://h/"),
        ("/usr/bin/curl -U proxy:hunter2 h", f"/usr/bin/curl -U proxy:{R} h"),
        ("mysql -uroot -phunter2 app", f"mysql -uroot -p{R} app"),
        # A password that holds a secret's name is still the password, not an option naming
        # one (the next word, the database, stays).
        ("mysql -pPassword123 app", f"mysql -p{R} app"),
        ("mysql -u root -psecretpw", f"mysql -u root -p{R}"),
        ("mariadb-dump -phunter2 app > a.sql", f"mariadb-dump -p{R} app > a.sql"),
        ("sshpass -p hunter2 ssh h", f"sshpass -p {R} ssh h"),
        ("cd /x\ncurl -u a:hunter2 h", f"cd /x\ncurl -u a:{R} h"),
        ("openssl enc -aes256 -k hunter2 -in f", f"openssl enc -aes256 -k {R} -in f"),
        ("openssl enc -K 00ff -iv 01 -in f", f"openssl enc -K {R} -iv 01 -in f"),
        ("openssl enc -pass pass:hunter2 </dev/null", f"openssl enc -pass pass:{R} </dev/null"),
        (
            "openssl pkcs12 -passin pass:hunter2 -passout 'pass:hunter2'",
            f"openssl pkcs12 -passin pass:{R} -passout 'pass:{R}'",
        ),
        ("docker login -u me -p hunter2 reg", f"docker login -u me -p {R} reg"),
        ("podman login -p hunter2 reg; true", f"podman login -p {R} reg; true"),
        ("az login -u ana -p 'hunter2'", f"az login -u ana -p '{R}'"),
        ("helm registry login -p hunter2 r", f"helm registry login -p {R} r"),
        ("docker --config /c login -p hunter2 r", f"docker --config /c login -p {R} r"),
        ("az acr login -n reg -p hunter2", f"az acr login -n reg -p {R}"),
        ("sudo -E oras login -p hunter2 r", f"sudo -E oras login -p {R} r"),
        ("htpasswd -b f user hunter2; true", f"htpasswd -b f user {R}; true"),
        ("htpasswd -bc f user hunter2", f"htpasswd -bc f user {R}"),
        ("htpasswd -nbB -C 10 user hunter2 > out", f"htpasswd -nbB -C 10 user {R} > out"),
        ("htpasswd -b f user hunter2 2>&1", f"htpasswd -b f user {R} 2>&1"),
    ],
)
def test_secrets_written_in_a_command_line_lose_their_values(command: str, logged: str) -> None:
    assert summarize({"cmd": command}) == {"cmd": logged}
    assert "hunter2" not in str(summarize_argv(["sh", "-c", command]))


@pytest.mark.parametrize(
    "command",
    [
        "mkdir -p /tmp/x && cp -p a b",
        "ssh -p 2222 host uptime",
        "docker run -u 1000:1000 img",
        "sort -u names.txt; diff -u a b",
        "mysql -p app",  # -p alone: mysql asks for the password, app is the database
        "curl -u admin https://h/",  # no password given: curl asks for it
        "curl --user-agent 'x:y' https://h/",
        "ssh://git@github.com:22/r http://host:8080/p?q=a@b",
        "docker run -u 1000:1000 img; curl https://h/",
        "docker run -p 8080:80 img",
        "docker login -u me reg",  # no -p: docker asks for the password
        "login -p -h host ana",  # login(1) itself: -p keeps the environment
        "grep login -p file",  # an operand, not a client's subcommand
        "openssl rsa -check -in k.pem -passin env:PW -passout file:/p",
        "openssl enc -kfile key.txt -in f",
        "htpasswd f user",  # no -b: htpasswd asks for the password
        "htpasswd -D f user",
    ],
)
def test_the_same_options_elsewhere_are_left_alone(command: str) -> None:
    assert summarize(command) == command


def test_an_argv_follows_the_same_rule() -> None:
    argv = ["curl", "-u", "admin:hunter2", "https://ana:pw@h/", "--password", "x"]

    assert summarize_argv(argv) == [
        "curl",
        "-u",
        f"admin:{R}",
        f"https://ana:{R}@h/",
        "--password",
        R,
    ]
    assert summarize_argv(["docker", "run", "-u", "1000:1000", "-p", "80:80"]) == [
        "docker",
        "run",
        "-u",
        "1000:1000",
        "-p",
        "80:80",
    ]
    assert summarize_argv(["mysql", "-uroot", "-phunter2"]) == ["mysql", "-uroot", f"-p{R}"]


def test_redacting_twice_changes_nothing() -> None:
    once = summarize("curl -u a:b https://c:d@h/ --token t; mysql -pX")

    assert summarize(once) == once


def test_an_argv_of_a_programs_secret_options_follows_the_same_rule() -> None:
    assert summarize_argv(["openssl", "enc", "-k", "x1", "-pass", "pass:x2", "-in", "f"]) == [
        "openssl",
        "enc",
        "-k",
        R,
        "-pass",
        f"pass:{R}",
        "-in",
        "f",
    ]
    assert summarize_argv(["docker", "login", "-p", "x3", "reg"]) == [
        "docker",
        "login",
        "-p",
        R,
        "reg",
    ]
    assert summarize_argv(["htpasswd", "-b", "f", "user", "x4"]) == [
        "htpasswd",
        "-b",
        "f",
        "user",
        R,
    ]
