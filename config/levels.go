// This file reads the groups above clients — organisations, and teams within them — and
// resolves the policies each client's requests are charged at those levels.
//
// LEVELS. A request of a client in team ml of organisation acme is decided under the client's own
// policies (its key), the team's (the key "team:ml") and the organisation's (the key "org:acme"),
// all in the one DecideAll of the request: allowed by all of them or refused by one, consuming
// nothing then. A group's key cannot be a client's (a client's name has no ':'), an anonymous
// client's ("ip:…") or a key_by one's ("by:…"), and a team's and an organisation's of the same
// name differ by their prefix.

package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The kinds of groups, as the file and answers name them, and the prefix of their keys.
const (
	LevelOrganisation = "organisation"
	LevelTeam         = "team"
	OrganisationKey   = "org:"  // an organisation's policies count under "org:" + its name
	TeamKey           = "team:" // a team's under "team:" + its name
)

// LevelsFor returns the limits a request of client on route is charged at the levels above the
// client (its team's and its organisation's policies; tokens and dollars on usage routes only),
// in that order, besides AppliedPoliciesFor's. They apply on every route, whatever its policy or
// scope: a group's quota is one counter for all its clients' requests. The slice is shared: do not
// modify it.
func (c *Config) LevelsFor(client *Client, route *Route) []AppliedPolicy {
	if client == nil {
		return nil
	}
	if route != nil && route.Usage != nil {
		return client.levels[1]
	}
	return client.levels[0]
}

// resolveLevels sets what cl is charged at the levels above it, from c's Teams and Organisations
// by name (an organisation: the client's own, else its team's). It is the one place that does, for
// a client of the file and for one added to the configuration later; cl's team and organisation
// must be c's.
func (c *Config) resolveLevels(cl *Client) {
	cl.levels = [2][]AppliedPolicy{}
	var groups []*Group
	var kinds []string
	org := cl.Organisation
	if t := c.teams[cl.Team]; t != nil {
		groups, kinds = append(groups, t), append(kinds, LevelTeam)
		if org == "" {
			org = t.Organisation
		}
	}
	if o := c.orgs[org]; o != nil {
		groups, kinds = append(groups, o), append(kinds, LevelOrganisation)
	}
	for u := range cl.levels {
		for i, g := range groups {
			key, level := TeamKey+g.Name, kinds[i]+" "+strconv.Quote(g.Name)
			if kinds[i] == LevelOrganisation {
				key = OrganisationKey + g.Name
			}
			for _, a := range c.resolution(g.Policy, "", u == 1).applied {
				a.Key, a.Level = key, level
				cl.levels[u] = append(cl.levels[u], a)
			}
		}
	}
}

// groups reads organisations, then teams (a team names its organisation).
func (p *parser) groups(m *mapping, c *Config, r *refs) {
	c.orgs, c.teams = map[string]*Group{}, map[string]*Group{}
	if n := p.get(m, "organisations"); n != nil {
		c.Organisations = p.groupList(n, "organisations", c.orgs, c, r)
	}
	if n := p.get(m, "teams"); n != nil {
		c.Teams = p.groupList(n, "teams", c.teams, c, r)
	}
}

// groupList reads one list of groups into byName.
func (p *parser) groupList(n *yaml.Node, field string, byName map[string]*Group, c *Config, r *refs) []*Group {
	var out []*Group
	seen := map[string]*yaml.Node{}
	p.listItems(n, field, func(i int, item *yaml.Node, m *mapping) {
		path := p.itemPath(field, i, m)
		if field == "teams" {
			p.checkKnown(m, path, groupFields...)
		} else {
			p.checkKnown(m, path, orgFields...)
		}
		g := &Group{Line: item.Line}
		name, ok := p.name(m, path, clientNameRE, "A-Z, a-z, 0-9, '.', '_' and '-'", seen)
		g.Name = name
		if on := p.get(m, "organisation"); on != nil && field == "teams" {
			if s, ok := p.str(on, path, "organisation"); ok {
				if c.orgs[s] == nil {
					p.errorf(on, path, nil, "organisation %q is not defined in organisations (%s)", s, knownGroups(c.Organisations, "organisations"))
				} else {
					g.Organisation = s
				}
			}
		}
		pn := p.get(m, "policy")
		if pn == nil {
			p.errorf(m.node, path, nil, "policy is required: the policies its clients' requests are charged together")
		} else {
			list := p.names(pn, path, "policy")
			for _, rf := range list {
				if pol := c.policies[rf.name]; pol != nil && pol.KeyBy != nil {
					p.errorf(rf.node, path, nil, "policy %q has a key_by; a group's policies count for the whole group (its key is the group's)", rf.name)
				}
			}
			r.lists = append(r.lists, refList{path, "policy", list, &g.Policy})
		}
		if ok {
			byName[name] = g
			out = append(out, g)
		}
	})
	return out
}

// clientGroups reads a client's team and organisation (the groups are read already).
func (p *parser) clientGroups(m *mapping, path string, cl *Client, c *Config) {
	var team *Group
	if n := p.get(m, "team"); n != nil {
		if s, ok := p.str(n, path, "team"); ok {
			if team = c.teams[s]; team == nil {
				p.errorf(n, path, nil, "team %q is not defined in teams (%s)", s, knownGroups(c.Teams, "teams"))
			} else {
				cl.Team, cl.Organisation = s, team.Organisation
			}
		}
	}
	n := p.get(m, "organisation")
	if n == nil {
		return
	}
	s, ok := p.str(n, path, "organisation")
	switch {
	case !ok:
	case c.orgs[s] == nil:
		p.errorf(n, path, nil, "organisation %q is not defined in organisations (%s)", s, knownGroups(c.Organisations, "organisations"))
	case team != nil && team.Organisation != s:
		in := "in no organisation"
		if team.Organisation != "" {
			in = fmt.Sprintf("in organisation %q", team.Organisation)
		}
		p.errorf(n, path, nil, "organisation %q is not its team's: team %q is %s (leave organisation out: a client is in its team's)", s, team.Name, in)
	default:
		cl.Organisation = s
	}
}

// checkClientGroups checks a runtime client's team and organisation as clientGroups checks a
// file's (CheckClient): each must be defined, and an organisation beside a team must be the team's.
func (c *Config) checkClientGroups(cl *Client) error {
	team, ok := c.teams[cl.Team]
	switch {
	case cl.Team != "" && !ok:
		return fieldErr("team", "%q is not defined in teams (%s)", cl.Team, knownGroups(c.Teams, "teams"))
	case cl.Organisation != "" && c.orgs[cl.Organisation] == nil:
		return fieldErr("organisation", "%q is not defined in organisations (%s)", cl.Organisation, knownGroups(c.Organisations, "organisations"))
	case team != nil && cl.Organisation != "" && cl.Organisation != team.Organisation:
		return fieldErr("organisation", "%q is not its team's: team %q is in organisation %q", cl.Organisation, team.Name, team.Organisation)
	}
	return nil
}

// knownGroups lists the groups' names for "is not defined" errors.
func knownGroups(groups []*Group, field string) string {
	if len(groups) == 0 {
		return "no " + field + " are configured"
	}
	names := make([]string, 0, min(len(groups), 11))
	for _, g := range groups[:min(len(groups), 10)] {
		names = append(names, g.Name)
	}
	if len(groups) > 10 {
		names = append(names, "...")
	}
	return "known: " + strings.Join(names, ", ")
}

// groupPolicyNames returns the names of every group's policies (for the checks of every name
// that may apply on a route).
func (c *Config) groupPolicyNames() []string {
	var names []string
	for _, g := range slices.Concat(c.Organisations, c.Teams) {
		names = append(names, g.Policy...)
	}
	return names
}
