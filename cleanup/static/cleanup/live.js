/*
 * Admin pages that stay current (cleanup.admin.live).
 *
 * The page's live bar (#live-bar) names a fragment URL (data-live-src) and a period in
 * seconds (data-live-every). While live, the fragment is read again every period and
 * the page's parts are brought up to date in place, without a reload:
 *   - an element with data-live-part and an id brings the page's element of that id up
 *     to date, changing only the text and attributes that differ (`morph`), unless the
 *     person is in it (focus, or text selected in it): then it waits a turn; nothing is
 *     changed between a press of the pointer and its click;
 *   - an element with data-live-into="<selector>" sets the text of the page's element
 *     it names (a read-only field of the run's form);
 *   - an element with data-live-rows="<table selector>" updates that table's rows cell
 *     by cell, keyed by the row's checkbox (or its first link), leaving the checkboxes
 *     alone so a selection survives; rows gone from the list are marked, rows new to it
 *     are counted with a link to see them.
 * When is it read again: when something happens. The page follows the change feed's event
 * stream (data-live-feed, else the API's /api/v1/events/changes/, as Server-Sent Events)
 * and reads the fragment a moment after each change it is told of; once the server has held
 * the stream open for two periods, the period is only a safety net, six times as long. Where
 * the stream cannot be had or is not held open (a person without the feed's permissions, a
 * browser without EventSource, a WSGI server that ends it at once), it reads every period.
 * A read sends back the tag of the last answer it applied whole (If-None-Match): a fragment
 * that did not change answers 304 with no body, and nothing is parsed or touched; an open
 * page nothing changes costs a few hundred bytes a read. A part left alone because the
 * person was in it is not remembered as read: the next read brings the whole fragment.
 * "Pause" stops the reading (remembered for the session); a hidden tab is not read.
 * No inline script and nothing from another site: the Content-Security-Policy allows it.
 */
'use strict';
(function () {
    const bar = document.getElementById('live-bar');
    if (!bar || !window.fetch || !window.DOMParser) {
        return;
    }
    const src = bar.dataset.liveSrc;
    const every = Math.max(1, Number(bar.dataset.liveEvery) || 5) * 1000;
    const toggle = document.getElementById('live-toggle');
    const state = document.getElementById('live-state');
    const age = document.getElementById('live-age');
    const note = document.getElementById('live-note');
    const PAUSED = 'cleanup-live-paused';
    let updatedAt = Date.now();
    let failure = '';
    let timer = null;
    let busy = false;
    const feed = bar.dataset.liveFeed || '/api/v1/events/changes/';
    let stream = null;
    let streaming = false;
    let openedAt = 0;
    let soon = null;
    // The tag of the last fragment applied whole, sent back so an unchanged one answers 304.
    let tag = null;
    // Between a press and its click nothing changes, so the click lands where it was aimed.
    let pointerDown = false;
    document.addEventListener('pointerdown', function () { pointerDown = true; }, true);
    document.addEventListener('pointerup', function () {
        window.setTimeout(function () { pointerDown = false; }, 0);
    }, true);

    function paused() {
        try {
            return window.sessionStorage.getItem(PAUSED) === '1';
        } catch (e) {
            return bar.dataset.paused === '1';
        }
    }

    function setPaused(value) {
        bar.dataset.paused = value ? '1' : '0';
        try {
            window.sessionStorage.setItem(PAUSED, value ? '1' : '0');
        } catch (e) { /* private mode: the switch holds for this page only */ }
        show();
        schedule();
    }

    function seconds(ms) {
        const s = Math.max(0, Math.round(ms / 1000));
        return s < 120 ? s + ' s' : Math.round(s / 60) + ' min';
    }

    function show() {
        const isPaused = paused();
        bar.classList.toggle('live-paused', isPaused);
        bar.classList.toggle('live-failing', !!failure);
        toggle.textContent = isPaused ? 'Go live' : 'Pause';
        toggle.setAttribute('aria-pressed', isPaused ? 'true' : 'false');
        state.textContent = isPaused ? 'Paused' : 'Live';
        const since = seconds(Date.now() - updatedAt);
        age.textContent = failure ? 'not updated for ' + since + ' (' + failure + ')' : 'updated ' + since + ' ago';
    }

    function personIsIn(element) {
        const active = document.activeElement;
        if (active && active !== document.body && element.contains(active)) {
            return true;
        }
        const selection = window.getSelection ? window.getSelection() : null;
        return !!(selection && !selection.isCollapsed && selection.rangeCount &&
            element.contains(selection.getRangeAt(0).commonAncestorContainer));
    }

    function rowKey(row) {
        const box = row.querySelector('input.action-select');
        if (box) {
            return 'pk:' + box.value;
        }
        const link = row.querySelector('a[href]');
        return link ? 'href:' + link.getAttribute('href') : null;
    }

    // Answers whether every row was brought up to date (none left alone for the person).
    function mergeRows(fresh) {
        const table = document.querySelector(fresh.dataset.liveRows);
        const freshTable = fresh.querySelector(fresh.dataset.liveRows);
        if (!table || !freshTable) {
            return true;
        }
        let whole = true;
        const incoming = new Map();
        freshTable.querySelectorAll('tbody tr').forEach(function (row) {
            const key = rowKey(row);
            if (key) {
                incoming.set(key, row);
            }
        });
        const present = new Set();
        table.querySelectorAll('tbody tr').forEach(function (row) {
            const key = rowKey(row);
            present.add(key);
            const update = incoming.get(key);
            row.classList.toggle('live-gone', !update);
            row.title = update ? '' : 'No longer in this list: it changed since the page was loaded';
            if (update && personIsIn(row)) {
                whole = false;
            }
            if (!update || personIsIn(row)) {
                return;
            }
            const cells = row.children;
            const freshCells = update.children;
            for (let i = 0; i < cells.length && i < freshCells.length; i++) {
                if (cells[i].classList.contains('action-checkbox')) {
                    continue;
                }
                if (cells[i].innerHTML !== freshCells[i].innerHTML) {
                    cells[i].innerHTML = freshCells[i].innerHTML;
                    cells[i].classList.add('live-changed');
                }
            }
        });
        const added = Array.from(incoming.keys()).filter(function (key) {
            return !present.has(key);
        }).length;
        note.textContent = '';
        if (added) {
            const link = document.createElement('a');
            link.href = window.location.href;
            link.id = 'live-new-rows';
            link.textContent = added + (added === 1 ? ' new row' : ' new rows') + ': show them';
            note.appendChild(link);
        }
        return whole;
    }

    // Bring `current` to what `fresh` is, changing only what differs: an element that keeps
    // its place keeps its identity, so a link being clicked is never swapped from under the
    // pointer, and a part whose counts did not change is not touched at all.
    function morph(current, fresh) {
        if (current.nodeType !== fresh.nodeType || current.nodeName !== fresh.nodeName) {
            current.replaceWith(document.importNode(fresh, true));
            return;
        }
        if (current.nodeType !== Node.ELEMENT_NODE) {
            if (current.nodeValue !== fresh.nodeValue) {
                current.nodeValue = fresh.nodeValue;
            }
            return;
        }
        Array.from(current.attributes).forEach(function (attr) {
            if (!fresh.hasAttribute(attr.name)) {
                current.removeAttribute(attr.name);
            }
        });
        Array.from(fresh.attributes).forEach(function (attr) {
            if (current.getAttribute(attr.name) !== attr.value) {
                current.setAttribute(attr.name, attr.value);
            }
        });
        const now = Array.from(current.childNodes);
        const next = Array.from(fresh.childNodes);
        for (let i = 0; i < next.length; i++) {
            if (i < now.length) {
                morph(now[i], next[i]);
            } else {
                current.appendChild(document.importNode(next[i], true));
            }
        }
        for (let i = next.length; i < now.length; i++) {
            now[i].remove();
        }
    }

    // Answers whether the whole fragment was applied (no part left alone for the person).
    function apply(html) {
        const doc = new DOMParser().parseFromString(html, 'text/html');
        let whole = true;
        doc.querySelectorAll('[data-live-part][id]').forEach(function (fresh) {
            const current = document.getElementById(fresh.id);
            if (current && personIsIn(current)) {
                whole = false;
            } else if (current) {
                morph(current, fresh);
            }
        });
        doc.querySelectorAll('[data-live-into]').forEach(function (fresh) {
            const current = document.querySelector(fresh.dataset.liveInto);
            if (current && current.textContent.trim() !== fresh.textContent.trim()) {
                current.textContent = fresh.textContent.trim();
            }
        });
        doc.querySelectorAll('[data-live-rows]').forEach(function (fresh) {
            whole = mergeRows(fresh) && whole;
        });
        return whole;
    }

    function read() {
        if (busy || paused() || document.hidden || pointerDown) {
            schedule();
            return;
        }
        busy = true;
        const headers = {'X-Requested-With': 'XMLHttpRequest'};
        if (tag) {
            headers['If-None-Match'] = tag;
        }
        let answerTag = null;
        // no-store: the tag is this script's, not the browser cache's, so a 304 is seen as one.
        fetch(src, {credentials: 'same-origin', cache: 'no-store', headers: headers})
            .then(function (response) {
                if (response.redirected) {
                    // The session ended (idle, or signed out elsewhere): the page itself
                    // now leads to the login, so it is loaded again rather than left stale.
                    window.location.reload();
                    throw new Error('signed out');
                }
                if (response.status === 304) {
                    return null;  // nothing changed since the fragment last applied whole
                }
                if (!response.ok) {
                    throw new Error('the server answered ' + response.status);
                }
                answerTag = response.headers.get('ETag');
                return response.text();
            })
            .then(function (html) {
                if (paused() || pointerDown) {
                    return;  // paused while the answer was on its way: the page stays as the person left it
                }
                if (html === null) {
                    bar.dataset.unchanged = String(Number(bar.dataset.unchanged || 0) + 1);
                } else {
                    tag = apply(html) ? answerTag : null;
                }
                updatedAt = Date.now();
                failure = '';
                bar.dataset.updates = String(Number(bar.dataset.updates || 0) + 1);
            })
            .catch(function (error) {
                failure = error && error.message ? error.message : 'no answer';
            })
            .then(function () {
                busy = false;
                show();
                schedule();
            });
    }

    function schedule() {
        window.clearTimeout(timer);
        timer = paused() ? null : window.setTimeout(read, held() ? every * 6 : every);
    }

    // The stream counts once the server has held it open a while: a server that sends what
    // there is and ends it (a WSGI server) leaves the page to its period, as before.
    function held() {
        return streaming && stream !== null && stream.readyState === window.EventSource.OPEN &&
            Date.now() - openedAt > every * 2;
    }

    // The change feed says when: a read shortly after each change (changes in a burst are
    // read once), and none while nothing happens.
    function follow() {
        if (stream || paused() || !window.EventSource) {
            return;
        }
        stream = new window.EventSource(feed);
        stream.addEventListener('open', function () {
            streaming = true;
            openedAt = Date.now();
        });
        stream.addEventListener('change', function () {
            if (soon === null) {
                soon = window.setTimeout(function () {
                    soon = null;
                    read();
                }, 250);
            }
        });
        stream.addEventListener('error', function () {
            streaming = false;
            if (stream && stream.readyState === window.EventSource.CLOSED) {
                // Refused (no permission to read the feed): the period alone, as before.
                stream = null;
                streaming = false;
                schedule();
            }
        });
    }

    function unfollow() {
        if (stream) {
            stream.close();
            stream = null;
        }
        streaming = false;
    }

    toggle.addEventListener('click', function () {
        setPaused(!paused());
        if (paused()) {
            unfollow();
        } else {
            follow();
            read();
        }
    });
    document.addEventListener('visibilitychange', function () {
        if (!document.hidden && !paused()) {
            read();
        }
    });
    bar.hidden = false;
    window.setInterval(show, 1000);
    show();
    follow();
    schedule();
}());
