# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The SSH options the pct connection and the proxmox_lxc inventory share: the one table their
documentation is made from.

Each row is one setting of the ssh command line both plugins build (_ssh.argv): its name, type and
default; where ansible reads it (``ini``: ansible.cfg sections and keys; ``env``: environment
variables; ``vars``: the connection's host variables; an inventory plugin takes no host variables);
its description; and the version that added it. Where the two plugins word a description
differently for their users, or added the option in different versions, the row holds both
(``Apart``).

From this table ``scripts/ssh_options.py`` writes the doc fragment
``gpufleet.hygiene.ssh_options`` (plugins/doc_fragments/ssh_options.py): its ``DOCUMENTATION``
block is the inventory's options, its ``CONNECTION`` block the connection's, with their ``vars``.
The plugins extend those blocks and do not document these options themselves. ``--check`` (part
of ``make lint`` and of the unit tests) fails when the fragment differs from the table: change a
row here, run the script, commit both.

The names, types, defaults and sources are public: ansible.cfg files, environment variables and
inventories set them. Change one only as a change of the plugins' interface.

Standard library only, so that the script loads it without ansible. Private to gpufleet.hygiene
(leading underscore): not a public API.
"""

from __future__ import annotations

from collections import namedtuple

PLUGINS = ("connection", "inventory")


class Apart(namedtuple("Apart", PLUGINS)):
    """A field's value for each plugin, where the two differ: in a description, the paragraphs (a
    tuple, empty for none) that stand at that place for each; for ``version_added``, each plugin's
    version (None: the plugin's own)."""

    __slots__ = ()


def each(value, plugin):
    """value as plugin ("connection" or "inventory") takes it: its part of an Apart, else value."""
    return getattr(value, plugin) if isinstance(value, Apart) else value


_FIELDS = ("name", "type", "default", "ini", "env", "vars", "description", "inventory_name", "node_var",
           "version_added")


class Option(namedtuple("Option", _FIELDS)):
    """One shared SSH option. ``name``: the connection's name, which the ``[gpufleet_pct]`` key and
    the containers' ``ansible_pct_<name>`` also use; ``inventory_name``: the inventory's name for it,
    where it differs. ``default``: None where the option has none. ``ini``: (section, key) pairs; ``env``, ``vars``: names; in ansible's order
    (where several are set, the later wins). ``description``: paragraphs, each a string (both
    plugins) or an Apart. ``node_var``: the variable the inventory also sets on each node it
    lists from this option."""

    __slots__ = ()

    def __new__(cls, name, type, default=None, ini=(), env=(), vars=(), description=(), inventory_name=None,
                node_var=None, version_added=None):
        return super(Option, cls).__new__(cls, name, type, default, tuple(ini), tuple(env), tuple(vars),
                                          tuple(description), inventory_name or name, node_var, version_added)

    @property
    def container_var(self):
        """The variable the inventory gives each container it finds from this option."""
        return "ansible_pct_" + self.name

    def name_in(self, plugin):
        return self.name if plugin == "connection" else self.inventory_name

    def paragraphs(self, plugin):
        """The description's paragraphs as plugin words them."""
        out = []
        for para in self.description:
            out += list(each(para, plugin)) if isinstance(para, Apart) else [para]
        return out


OPTIONS = (
    Option(
        "node_user", "string", default="root", inventory_name="user", node_var="ansible_user",
        ini=[("gpufleet_pct", "node_user")], env=["GPUFLEET_PCT_NODE_USER"], vars=["ansible_user", "ansible_pct_node_user"],
        description=(
            Apart(
                connection=(
                    "User to log in to the node as. It must be allowed to run C(pct exec) (normally root).",
                    "A name ssh would read as an option (a leading C(-)) or with characters no user name has is refused.",
                    "Commands inside the container start as root; use C(become) to run as another user there.",
                ),
                inventory=("SSH user on the nodes (must be allowed to run C(pct)); a node's own C(user) in O(nodes) wins.",),
            ),
        ),
    ),
    Option(
        "node_port", "int", default=22, inventory_name="port", node_var="ansible_port",
        ini=[("gpufleet_pct", "node_port")], env=["GPUFLEET_PCT_NODE_PORT"], vars=["ansible_port", "ansible_pct_node_port"],
        description=(
            Apart(
                connection=("SSH port of the node.",),
                inventory=("SSH port of the nodes; a node's own C(port) in O(nodes) wins.",),
            ),
        ),
    ),
    Option(
        "private_key_file", "path", node_var="ansible_ssh_private_key_file",
        ini=[("gpufleet_pct", "private_key_file")], env=["GPUFLEET_PCT_PRIVATE_KEY_FILE"],
        vars=["ansible_private_key_file", "ansible_ssh_private_key_file", "ansible_pct_private_key_file"],
        description=(
            ("Private key for the SSH login to the nodes (C(ssh -i), with C(IdentitiesOnly=yes)); ssh's own keys and "
             "agent when unset."),
        ),
    ),
    Option(
        "known_hosts_file", "path",
        ini=[("gpufleet_pct", "known_hosts_file")], env=["GPUFLEET_PCT_KNOWN_HOSTS_FILE"], vars=["ansible_pct_known_hosts_file"],
        description=(
            ("Known-hosts file with the nodes' host keys (C(UserKnownHostsFile)); ssh's own (C(~/.ssh/known_hosts) and "
             "C(/etc/ssh/ssh_known_hosts)) when unset."),
        ),
    ),
    Option(
        "host_key_checking", "bool", default=True,
        ini=[("defaults", "host_key_checking"), ("gpufleet_pct", "host_key_checking")],
        env=["ANSIBLE_HOST_KEY_CHECKING", "GPUFLEET_PCT_HOST_KEY_CHECKING"],
        vars=["ansible_host_key_checking", "ansible_pct_host_key_checking"],
        description=(
            "Refuse nodes whose host key is unknown or does not match (C(StrictHostKeyChecking=yes)). On by default.",
            ("When off, host keys are neither checked nor recorded (C(StrictHostKeyChecking=no), "
             "C(UserKnownHostsFile=/dev/null))."),
            Apart(
                connection=(),
                inventory=(("Read from ansible's own C(host_key_checking) setting (C([defaults]) in ansible.cfg, "
                            "E(ANSIBLE_HOST_KEY_CHECKING)) as the connection does, unless this file sets it."),),
            ),
        ),
    ),
    Option(
        "connect_timeout", "int", default=10,
        ini=[("gpufleet_pct", "connect_timeout")], env=["GPUFLEET_PCT_CONNECT_TIMEOUT"], vars=["ansible_pct_connect_timeout"],
        description=(
            Apart(
                connection=("Seconds to wait for the SSH connection to the node (C(ConnectTimeout)).",),
                inventory=("Seconds to wait for each node's SSH connection (C(ConnectTimeout)), and for each command's output.",),
            ),
        ),
    ),
    Option(
        "ssh_executable", "string", default="ssh", version_added=Apart(connection=None, inventory="0.3.0"),
        ini=[("gpufleet_pct", "ssh_executable")], env=["GPUFLEET_PCT_SSH_EXECUTABLE"], vars=["ansible_pct_ssh_executable"],
        description=("The OpenSSH client to run.",),
    ),
    Option(
        "ssh_extra_args", "string", default="", version_added=Apart(connection=None, inventory="0.3.0"),
        ini=[("gpufleet_pct", "ssh_extra_args")], env=["GPUFLEET_PCT_SSH_EXTRA_ARGS"], vars=["ansible_pct_ssh_extra_args"],
        description=(
            "Extra arguments for ssh, split like a shell would (for example C(-o ProxyJump=bastion)).",
            "They are passed as separate arguments, never through a shell.",
        ),
    ),
    Option(
        "control_path_dir", "path", default="~/.ansible/cp", version_added=Apart(connection=None, inventory="0.3.0"),
        ini=[("gpufleet_pct", "control_path_dir")], env=["GPUFLEET_PCT_CONTROL_PATH_DIR"], vars=["ansible_pct_control_path_dir"],
        description=(
            "Directory of the SSH master sockets (C(ControlPath)), private to this user (0700, made when missing).",
            Apart(
                connection=(("The socket is named after a hash of the node's user, address and port, so every container of "
                             "one node shares one master."),),
                inventory=(("The containers' connection uses the same directory, so that the play's first tasks reuse the "
                            "master the inventory opened."),),
            ),
        ),
    ),
    Option(
        "control_persist", "int", default=60, version_added=Apart(connection=None, inventory="0.3.0"),
        ini=[("gpufleet_pct", "control_persist")], env=["GPUFLEET_PCT_CONTROL_PERSIST"], vars=["ansible_pct_control_persist"],
        description=("Seconds a node's SSH master connection stays open when idle (C(ControlPersist)).",),
    ),
)

BY_NAME = {row.name: row for row in OPTIONS}
