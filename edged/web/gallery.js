// The face gallery on the status page: enrolled names with their counts, and the unknown
// groups with the aligned faces they kept, read from the gallery's own GET routes
// (/v2/edged/galleries/faces...; the same listeners, owner checks and bounds as the rest of
// the page). Only names, counts and the kept crops (PNG) are shown: the routes never give
// vectors. Shown only on a daemon whose status report has `faces`; polled every
// GALLERY_EVERY_MS, and a group's sightings are asked again only when the group changed.
"use strict";

(() => {
  const GALLERY = "/v2/edged/galleries/faces";
  const GALLERY_EVERY_MS = 10000;
  const NAMES_SHOWN = 50;
  const GROUPS_SHOWN = 8;
  const CROPS_SHOWN = 4;
  const state = { at: 0, key: "", crops: new Map() }; // group -> {key, ids}

  async function sightings(group) {
    const key = `${group.sightings}:${group.last_seen}`;
    const held = state.crops.get(group.group);
    if (held && held.key === key) return held.ids;
    const answer = await getJSON(`${GALLERY}/groups/${enc(group.group)}`);
    const ids = (answer.sightings || []).filter((s) => s.has_crop).slice(-CROPS_SHOWN)
      .map((s) => s.id);
    state.crops.set(group.group, { key, ids });
    return ids;
  }

  function namesTable(names) {
    if (!names.length) return el("p", { class: "muted", text: "no one enrolled" });
    const rows = names.slice(0, NAMES_SHOWN).map((n) => el("tr", { "data-name": n.name },
      el("td", { text: n.name }), el("td", { text: String(n.entries) }),
      el("td", { text: String(n.negatives) })));
    const table = el("table", { class: "names" }, el("thead", {}, el("tr", {},
      ...["name", "faces", "not this one"].map((t) => el("th", { text: t })))),
      el("tbody", {}, ...rows));
    const more = names.length > NAMES_SHOWN
      ? el("p", { class: "muted", text: `and ${names.length - NAMES_SHOWN} more` }) : null;
    return el("div", {}, table, more);
  }

  async function groupCards(groups) {
    if (!groups.length) return [el("p", { class: "muted", text: "no unknown faces kept" })];
    const newest = [...groups].sort((a, b) => b.last_seen - a.last_seen).slice(0, GROUPS_SHOWN);
    const cards = [];
    for (const g of newest) {
      const ids = await sightings(g);
      cards.push(el("div", { class: "group", "data-group": String(g.group) },
        el("div", { class: "crops" }, ...ids.map((id) => el("img", {
          src: `${GALLERY}/sightings/${enc(id)}/crop`, alt: `group ${g.group}, sighting ${id}`,
          class: "crop", loading: "lazy" }))),
        el("div", { class: "what", text: `unknown group ${g.group}` }),
        el("div", { class: "muted", text: `${g.sightings} kept · seen ${ago(g.last_seen)}` })));
    }
    if (groups.length > GROUPS_SHOWN) {
      cards.push(el("p", { class: "muted", text: `and ${groups.length - GROUPS_SHOWN} more groups` }));
    }
    return cards;
  }

  async function draw(listing) {
    const c = listing.counts || {};
    const e = listing.embedder || {};
    const stale = e.stale ? ` · ${e.stale} row(s) to re-embed${e.reembedding ? " (re-embedding)" : ""}` : "";
    document.getElementById("gallery-summary").textContent =
      `${c.entries ?? 0} of ${c.max_entries ?? "?"} faces enrolled · ` +
      `${c.unknowns ?? 0} of ${c.max_unknowns ?? "?"} unknown sightings kept${stale}`;
    document.getElementById("gallery-names").replaceChildren(namesTable(listing.names || []));
    document.getElementById("gallery-groups").replaceChildren(...await groupCards(listing.groups || []));
  }

  // Called by app.js with each status report.
  window.drawGallery = async (status) => {
    const section = document.getElementById("gallery");
    if (!status.faces) {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    if (Date.now() - state.at < GALLERY_EVERY_MS) return;
    state.at = Date.now();
    try {
      const listing = await getJSON(GALLERY);
      const key = JSON.stringify([listing.names, listing.groups, listing.counts, listing.embedder]);
      if (key === state.key) return; // unchanged: keep the pictures as they are
      state.key = key;
      await draw(listing);
    } catch (error) {
      document.getElementById("gallery-summary").textContent = `gallery unreadable: ${error}`;
    }
  };
})();
