-- eventsite: the Luanti side of the eventsite `luanti` module (docs/luanti.md).
--
-- Luanti has no remote console, so the module talks to this mod through files in the
-- world directory, the only place a mod may write with mod security on:
--
--   <world>/eventsite/inbox/<id>.json    requests, written atomically by the module
--   <world>/eventsite/outbox/<id>.json   answers, written atomically by this mod
--   <world>/eventsite/heartbeat.json     touched every second: the server is running
--   <world>/eventsite/state.lua          what this mod made, under which key
--
-- A request is taken by removing its file: once the module has removed it itself (it
-- gave up waiting), the request cannot land. A request past its deadline is dropped; an
-- answer is remembered by the request's key for a while, so a request sent again under
-- its key is answered again instead of acting twice.
--
-- The dead-man's switch: the core keeps a session here (op `keepalive`), and a spawn or a
-- setting changed under it is filed under it, in state.lua, so that a restart forgets
-- nothing. A session that hears no keepalive for its ttl gives back, by itself, what is
-- filed under it (creatures removed, forceloads freed, each setting still at the value
-- set under it put back to its baseline), and remembers what it did for the core's next
-- keepalive. A restart gives every session a full ttl again: it never gives back early.
--
-- Creatures are entities of this mod's own type, each carrying its run, ref and key in
-- its staticdata, so a map save keeps them and a restart brings them back. Without
-- players no block stays active, so each spawn forceloads its block (a transient
-- forceload this mod records and takes again at every start) and gives it back with
-- its creatures.

local DIR = minetest.get_worldpath() .. "/eventsite"
local INBOX = DIR .. "/inbox"
local OUTBOX = DIR .. "/outbox"
local HEARTBEAT = DIR .. "/heartbeat.json"
local STATE = DIR .. "/state.lua"
local ENTITY = "eventsite:creature"
local MAX_COUNT = 50
local MAX_COORD = 30000
local KEEP_S = 7 * 24 * 3600 -- how long a record of something given back is kept
local HEARTBEAT_S = 1.0

-- The settings a lease may change, with the value that is in force when they are unset.
local LEASABLE = {
	["time_speed"] = 72,
	["eventsite.spawn_rate"] = 1,
}

local function memory_s()
	return tonumber(minetest.settings:get("eventsite.answer_memory_s") or "") or 600
end

minetest.mkdir(INBOX)
minetest.mkdir(OUTBOX)

-- No boot id in Luanti: make one at load. Refs carry it, so they are unique across boots.
local boot_id = string.format("%x-%x", os.time(), minetest.get_us_time() % 0x100000000)
local counter = 0
local function new_ref(prefix)
	counter = counter + 1
	return string.format("%s-%s-%d", prefix, boot_id, counter)
end

-- -- state --------------------------------------------------------------------------

local state = { spawns = {}, creatures = {}, forceloads = {}, sessions = {} }

local function load_state()
	local f = io.open(STATE, "r")
	if not f then
		return
	end
	local text = f:read("*a")
	f:close()
	local loaded = text and text ~= "" and minetest.deserialize(text, true)
	if type(loaded) ~= "table" then
		minetest.log("error", "[eventsite] " .. STATE .. " is unreadable; starting from an empty record")
		return
	end
	for _, name in ipairs({ "spawns", "creatures", "forceloads", "sessions" }) do
		state[name] = type(loaded[name]) == "table" and loaded[name] or {}
	end
end

local function save_state()
	if not minetest.safe_file_write(STATE, minetest.serialize(state)) then
		minetest.log("error", "[eventsite] could not write " .. STATE)
	end
end

local function prune_state()
	local now = os.time()
	for ref, rec in pairs(state.creatures) do
		if rec.removed and now - rec.removed > KEEP_S then
			state.creatures[ref] = nil
		end
	end
	for ref, rec in pairs(state.forceloads) do
		if not rec.held and now - (rec.freed or 0) > KEEP_S then
			state.forceloads[ref] = nil
		end
	end
	for key, s in pairs(state.spawns) do
		if now - (s.at or 0) > KEEP_S then
			local left = s.forceload and state.forceloads[s.forceload]
			for _, ref in ipairs(s.refs or {}) do
				left = left or state.creatures[ref]
			end
			if not left then
				state.spawns[key] = nil
			end
		end
	end
end

load_state()
prune_state()
-- The core had no way to reach a server that was not running: a full ttl from now.
for _, sess in pairs(state.sessions) do
	sess.renewed = os.time()
end

-- -- creatures -------------------------------------------------------------------------

local active = {} -- ref -> ObjectRef, for the creatures in active blocks

local function live(ref)
	local obj = active[ref]
	if obj and obj:get_pos() then
		return obj
	end
	active[ref] = nil
	return nil
end

minetest.register_entity(ENTITY, {
	initial_properties = {
		physical = false,
		collide_with_objects = false,
		pointable = true,
		visual = "upright_sprite",
		textures = { "eventsite_creature.png" },
		static_save = true,
		hp_max = 1,
	},
	on_activate = function(self, staticdata)
		local data = staticdata ~= "" and minetest.parse_json(staticdata) or nil
		if type(data) ~= "table" or type(data.ref) ~= "string" then
			self.object:remove() -- not one of ours: only events make these
			return
		end
		if live(data.ref) then
			self.object:remove() -- the same creature twice: keep one
			return
		end
		self._data = data
		self.object:set_armor_groups({ immortal = 1 })
		self.object:set_properties({ nametag = tostring(data.entity or "") })
		active[data.ref] = self.object
	end,
	on_deactivate = function(self)
		if self._data and active[self._data.ref] == self.object then
			active[self._data.ref] = nil
		end
	end,
	get_staticdata = function(self)
		return self._data and minetest.write_json(self._data) or ""
	end,
})

-- -- blocks ----------------------------------------------------------------------------

local function block_of(pos)
	return { x = math.floor(pos.x / 16), y = math.floor(pos.y / 16), z = math.floor(pos.z / 16) }
end

local function block_key(pos)
	local b = block_of(pos)
	return b.x .. "," .. b.y .. "," .. b.z
end

local function block_active(pos)
	return minetest.compare_block_status(pos, "active") == true
end

-- Wakes the blocks of `refs` (transient forceloads, given back by `release`). Answers
-- {pending = {ref = pos}, unwakable = {ref = reason}, release = function}.
local function wake(refs_at)
	local taken, pending, unwakable = {}, {}, {}
	for ref, pos in pairs(refs_at) do
		local k = block_key(pos)
		if taken[k] == nil then
			taken[k] = minetest.forceload_block(pos, true) and pos or false
			if taken[k] then
				minetest.load_area(pos)
			end
		end
		if taken[k] then
			pending[ref] = pos
		else
			unwakable[ref] = "its block at " .. minetest.pos_to_string(pos)
				.. " is not active and no forceload slot is free to wake it (max_forceloaded_blocks)"
		end
	end
	local function release()
		for _, pos in pairs(taken) do
			if pos then
				minetest.forceload_free_block(pos, true)
			end
		end
		taken = {}
	end
	return { pending = pending, unwakable = unwakable, release = release }
end

local function all_active(pending)
	for _, pos in pairs(pending) do
		if not block_active(pos) then
			return false
		end
	end
	return true
end

-- -- the operations ------------------------------------------------------------------
-- Each answers (body, remember) at once, or queues a job that answers later (nil).

local jobs = {}
local OPS = {}

local function failure(error, retry)
	return { ok = false, error = error, retry = retry }
end

local function is_list_of_strings(v)
	if type(v) ~= "table" then
		return false
	end
	for _, item in ipairs(v) do
		if type(item) ~= "string" then
			return false
		end
	end
	return true
end

local function position(at)
	if type(at) ~= "table" or #at ~= 3 then
		return nil
	end
	local p = {}
	for i, axis in ipairs({ "x", "y", "z" }) do
		local n = at[i]
		if type(n) ~= "number" or n ~= n or math.abs(n) > MAX_COORD then
			return nil
		end
		p[axis] = math.floor(n + 0.5)
	end
	return p
end

function OPS.health(req)
	local n = 0
	for ref in pairs(active) do
		if live(ref) then
			n = n + 1
		end
	end
	return { ok = true, active = n, jobs = #jobs }
end

local function spawned(s, replayed)
	return { ok = true, creatures = s.refs, forceload = s.forceload, replayed = replayed }
end

local function place(s, key)
	if s.state == "done" then
		return true
	end
	local refs, objs = {}, {}
	for i = 1, s.count do
		local ref = new_ref("cr")
		refs[i] = ref
		state.creatures[ref] = { key = key, pos = s.pos }
	end
	save_state() -- recorded before they are in the world
	for i, ref in ipairs(refs) do
		local data = { ref = ref, key = key, run = s.run, entity = s.entity }
		objs[i] = minetest.add_entity(s.pos, ENTITY, minetest.write_json(data))
		if not objs[i] then
			for _, obj in pairs(objs) do
				obj:remove()
			end
			for _, r in ipairs(refs) do
				state.creatures[r].removed = os.time()
			end
			save_state()
			return false
		end
	end
	s.refs, s.state = refs, "done"
	save_state()
	return true
end

-- The session a request files under, or nil and why it may not (nil, nil: none named).
local function session_of(req)
	if req.session == nil then
		return nil, nil
	end
	local sess = type(req.session) == "string" and state.sessions[req.session]
	if not sess then
		return nil, failure("no session " .. tostring(req.session) .. ": arm it with keepalive first", true)
	end
	if sess.lapsed then
		return nil, failure("session " .. req.session .. " lapsed: its switch gave back what it held", true)
	end
	return sess, nil
end

function OPS.keepalive(req)
	local id, ttl = req.session, req.ttl_s
	if type(id) ~= "string" or id == "" or #id > 100 then
		return failure("session must be a non-empty string", false)
	end
	if type(ttl) ~= "number" or ttl <= 0 then
		return failure("ttl_s must be a number of seconds above 0", false)
	end
	local sess = state.sessions[id]
	if sess and sess.lapsed then
		return { ok = true, session = id, lapsed = sess.lapsed }
	end
	if not sess then
		sess = { keys = {}, settings = {} }
		state.sessions[id] = sess
	end
	sess.ttl_s, sess.renewed = ttl, os.time()
	save_state()
	return { ok = true, session = id }
end

function OPS.spawn(req)
	local sess, refused = session_of(req)
	if refused then
		return refused
	end
	if sess and type(req.spawn_key) == "string" and req.spawn_key ~= "" then
		sess.keys[req.spawn_key] = true -- saved with the spawn's own record below
	end
	local key, entity, count, pos = req.spawn_key, req.entity, req.count, position(req.at)
	if type(key) ~= "string" or key == "" then
		return failure("a spawn needs its key", false)
	end
	if type(entity) ~= "string" or not entity:match("^[%w_%-]+$") or #entity > 64 then
		return failure("entity must be a name of letters, digits, _ and - (at most 64)", false)
	end
	if type(count) ~= "number" or count ~= math.floor(count) or count < 1 or count > MAX_COUNT then
		return failure("count must be a whole number from 1 to " .. MAX_COUNT, false)
	end
	if not pos then
		return failure("at must be [x, y, z], each within " .. MAX_COORD, false)
	end
	local s = state.spawns[key]
	if s and s.state == "revoked" then
		return failure("the spawn under this key was revoked: its step was given back", false)
	end
	if s and (s.entity ~= entity or s.count ~= count or not vector.equals(s.pos, pos)) then
		return failure("this key already spawned " .. s.count .. " " .. s.entity .. " at "
			.. minetest.pos_to_string(s.pos), false)
	end
	if s and s.state == "done" then
		return spawned(s, true), true
	end
	if not s then
		if not minetest.forceload_block(pos, true) then
			return failure("no forceload slot is free for the block at " .. minetest.pos_to_string(pos)
				.. " (max_forceloaded_blocks); they come free as events end", true)
		end
		local fref = new_ref("fl")
		state.forceloads[fref] = { key = key, pos = pos, held = true }
		s = { run = req.run, entity = entity, count = count, pos = pos, refs = {}, state = "pending",
			forceload = fref, at = os.time() }
		state.spawns[key] = s
		save_state()
		minetest.emerge_area(pos, pos)
	end
	-- A freshly generated block loses the objects stored in it when it first activates:
	-- place the creatures only once the block is active.
	jobs[#jobs + 1] = {
		req = req,
		poll = function()
			if s.state == "revoked" then
				return failure("the spawn under this key was revoked: its step was given back", false)
			end
			if s.state ~= "done" and not block_active(pos) then
				return nil
			end
			if not place(s, key) then
				return failure("Luanti refused to add the creatures at " .. minetest.pos_to_string(pos), true)
			end
			return spawned(s, false), true
		end,
		give_up = function()
			-- Nothing lands after this: the creatures are placed only while a request waits.
			return failure("the block at " .. minetest.pos_to_string(pos)
				.. " did not become active in time; the spawn waits for it under its key", true)
		end,
	}
	return nil
end

-- Sorts refs into the ones this mod can tell about now and the ones in blocks it must wake.
local function sort_refs(refs)
	local creatures, forceloads, asleep = {}, {}, {}
	for _, ref in ipairs(refs) do
		local fl = state.forceloads[ref]
		if fl then
			forceloads[#forceloads + 1] = ref
		else
			local rec = state.creatures[ref]
			if live(ref) or not rec or block_active(rec.pos) then
				creatures[#creatures + 1] = ref -- present, or certainly not in the world
			else
				asleep[ref] = rec.pos
			end
		end
	end
	return creatures, forceloads, asleep
end

function OPS.lookup(req)
	if not is_list_of_strings(req.refs) then
		return failure("refs must be a list of strings", false)
	end
	local present, absent, unknown = {}, {}, {}
	local creatures, forceloads, asleep = sort_refs(req.refs)
	for _, ref in ipairs(creatures) do
		local list = live(ref) and present or absent
		list[#list + 1] = ref
	end
	for _, ref in ipairs(forceloads) do
		local list = state.forceloads[ref].held and present or absent
		list[#list + 1] = ref
	end
	local function answer()
		return { ok = true, present = present, absent = absent, unknown = unknown }
	end
	if next(asleep) == nil then
		return answer()
	end
	local woken = wake(asleep)
	for ref in pairs(woken.unwakable) do
		unknown[#unknown + 1] = ref
	end
	jobs[#jobs + 1] = {
		req = req,
		poll = function()
			if not all_active(woken.pending) then
				return nil
			end
			for ref in pairs(woken.pending) do
				local list = live(ref) and present or absent
				list[#list + 1] = ref
			end
			woken.release()
			return answer()
		end,
		give_up = function()
			-- Not woken in time: not known, never "gone".
			for ref, pos in pairs(woken.pending) do
				local list = block_active(pos) and (live(ref) and present or absent) or unknown
				list[#list + 1] = ref
			end
			woken.release()
			return answer()
		end,
	}
	return nil
end

local function remove(ref, removed, absent)
	local rec = state.creatures[ref]
	local obj = live(ref)
	if obj then
		obj:remove()
		active[ref] = nil
		removed[#removed + 1] = ref
	else
		absent[#absent + 1] = ref
	end
	if rec and not rec.removed then
		rec.removed = os.time()
	end
end

local function free(ref, removed, absent)
	local rec = state.forceloads[ref]
	if rec.held then
		minetest.forceload_free_block(rec.pos, true)
		rec.held, rec.freed = false, os.time()
		removed[#removed + 1] = ref
	else
		absent[#absent + 1] = ref
	end
end

function OPS.despawn(req)
	local refs, key = req.refs, req.spawn_key
	if refs == nil then
		refs = {}
	end
	if not is_list_of_strings(refs) then
		return failure("refs must be a list of strings", false)
	end
	if #refs == 0 and type(key) == "string" and key ~= "" then
		-- Whatever the key made; and nothing more may land under it.
		local s = state.spawns[key]
		if not s then
			s = { state = "revoked", refs = {}, at = os.time() }
			state.spawns[key] = s
		end
		if s.state ~= "done" then
			s.state = "revoked"
		end
		s.revoked = os.time()
		for _, ref in ipairs(s.refs) do
			refs[#refs + 1] = ref
		end
		if s.forceload then
			refs[#refs + 1] = s.forceload
		end
		save_state()
	end
	local removed, absent, failed = {}, {}, {}
	local creatures, forceloads, asleep = sort_refs(refs)
	for _, ref in ipairs(creatures) do
		remove(ref, removed, absent)
	end
	local function finish()
		-- The spawn's own forceloads go last: its creatures were woken by them.
		for _, ref in ipairs(forceloads) do
			free(ref, removed, absent)
		end
		save_state()
		return { ok = true, removed = removed, absent = absent, failed = failed }
	end
	if next(asleep) == nil then
		return finish()
	end
	local woken = wake(asleep)
	for ref, why in pairs(woken.unwakable) do
		failed[ref] = why
	end
	jobs[#jobs + 1] = {
		req = req,
		poll = function()
			if not all_active(woken.pending) then
				return nil
			end
			for ref in pairs(woken.pending) do
				remove(ref, removed, absent)
			end
			woken.release()
			return finish()
		end,
		give_up = function()
			for ref, pos in pairs(woken.pending) do
				if block_active(pos) then
					remove(ref, removed, absent)
				else
					failed[ref] = "its block at " .. minetest.pos_to_string(pos)
						.. " is not active and did not wake in time"
				end
			end
			woken.release()
			return finish()
		end,
	}
	return nil
end

-- Read a setting, or set it: only while it still is `expected` (when given), all in
-- this one server step. A value already at `baseline` is success: nothing to do.
function OPS.setting(req)
	local name = req.setting
	local unset = type(name) == "string" and LEASABLE[name]
	if unset == nil or unset == false then
		return failure("the setting " .. tostring(name) .. " is not one an event may lease", false)
	end
	local current = tonumber(minetest.settings:get(name) or "") or unset
	if req.value == nil then
		return { ok = true, value = current }
	end
	if type(req.value) ~= "number" or req.value ~= req.value then
		return failure("a value must be a number", false)
	end
	if req.baseline ~= nil and current == req.baseline then
		return { ok = true, value = current, already = true }
	end
	if req.expected ~= nil and current ~= req.expected then
		return { ok = false, drifted = true, current = current }
	end
	local sess, refused = session_of(req)
	if refused then
		return refused
	end
	minetest.settings:set(name, tostring(req.value))
	if sess then
		local held = sess.settings[name]
		if not held then
			sess.settings[name] = { baseline = current, applied = req.value }
		elseif req.value == held.baseline then
			sess.settings[name] = nil -- the core put the baseline back itself
		else
			held.applied = req.value
		end
		save_state()
	end
	return { ok = true, value = req.value, previous = current }
end

-- The switch: give back what a silent session holds, and remember it.
local function give_back(sess, silent)
	local given, kept = {}, {}
	for key in pairs(sess.keys) do
		local s = state.spawns[key]
		if s then
			if s.state ~= "done" then
				s.state = "revoked" -- nothing more lands under it
			end
			s.revoked = os.time()
			for _, ref in ipairs(s.refs or {}) do
				local rec = state.creatures[ref]
				local obj = live(ref)
				if obj then
					obj:remove()
					active[ref] = nil
					given[#given + 1] = ref
				elseif rec and not rec.removed and not block_active(rec.pos) then
					kept[ref] = "its block is not active: it may still be there"
				end
				if rec and not rec.removed and not kept[ref] then
					rec.removed = os.time()
				end
			end
			local fl = s.forceload and state.forceloads[s.forceload]
			if fl and fl.held then
				minetest.forceload_free_block(fl.pos, true)
				fl.held, fl.freed = false, os.time()
				given[#given + 1] = s.forceload
			end
		end
	end
	local settings = {}
	for name, held in pairs(sess.settings) do
		local current = tonumber(minetest.settings:get(name) or "") or LEASABLE[name]
		if current == held.applied then
			minetest.settings:set(name, tostring(held.baseline))
			settings[name] = held.baseline
		elseif current == held.baseline then
			settings[name] = held.baseline
		else
			kept["setting:" .. name] = "it is " .. tostring(current) .. ", not the "
				.. tostring(held.applied) .. " set under the session"
		end
	end
	sess.keys, sess.settings = {}, {}
	sess.lapsed = { at = os.time(), ttl_s = sess.ttl_s, silent_s = silent, creatures = given,
		settings = settings, kept = kept }
	minetest.log("action", "[eventsite] a session went " .. silent .. " s without a keepalive: gave back "
		.. #given .. " creature(s) and forceload(s)")
end

local function lapse_due()
	local now, changed = os.time(), false
	for _, sess in pairs(state.sessions) do
		local silent = now - (sess.renewed or now)
		if not sess.lapsed and sess.ttl_s and silent >= sess.ttl_s then
			give_back(sess, silent)
			changed = true
		end
	end
	if changed then
		save_state()
	end
end

-- -- the mailbox -----------------------------------------------------------------------

local memory = {} -- request key -> {body, until}

local function write_answer(req, body)
	body.boot_id = boot_id
	body.id = req.id
	local text, err = minetest.write_json(body)
	if not text then
		text = minetest.write_json({ ok = false, error = "the mod could not write its answer: " .. tostring(err),
			retry = true, boot_id = boot_id, id = req.id })
	end
	if not minetest.safe_file_write(OUTBOX .. "/" .. req.id .. ".json", text) then
		minetest.log("error", "[eventsite] could not write the answer to " .. req.id)
	end
end

local function finish(req, body, remember)
	if remember and type(req.key) == "string" and req.key ~= "" then
		memory[req.key] = { body = body, ["until"] = os.time() + memory_s() }
	end
	write_answer(req, body)
end

local function run(req, fn)
	local ok, body, remember = pcall(fn)
	if not ok then
		minetest.log("error", "[eventsite] " .. tostring(req.op) .. " failed: " .. tostring(body))
		return failure("the mod failed: " .. tostring(body), true)
	end
	return body, remember
end

local function handle(req)
	-- os.time() has whole seconds; a request is dropped once a whole second past its deadline.
	if type(req.deadline) ~= "number" or os.time() > req.deadline then
		minetest.log("action", "[eventsite] dropped " .. tostring(req.op) .. " " .. req.id .. ": past its deadline")
		return
	end
	req.answer_by = minetest.get_us_time() + math.max(0, req.deadline - os.time() - 1) * 1000000
	local remembered = type(req.key) == "string" and memory[req.key]
	if remembered and remembered["until"] >= os.time() then
		local body = table.copy(remembered.body)
		body.replayed = true
		write_answer(req, body)
		return
	end
	local op = OPS[req.op]
	if not op then
		write_answer(req, failure("the mod has no operation " .. tostring(req.op), false))
		return
	end
	local body, remember = run(req, function()
		return op(req)
	end)
	if body ~= nil then
		finish(req, body, remember)
	end
end

local function take_requests()
	local names = minetest.get_dir_list(INBOX, false) or {}
	table.sort(names) -- the module names them by time
	for _, name in ipairs(names) do
		local id = name:match("^([%w%-]+)%.json$")
		if id then
			local path = INBOX .. "/" .. name
			local f = io.open(path, "r")
			local text = f and f:read("*a")
			if f then
				f:close()
			end
			-- Taken only once removed: a module that removed it first knows it never landed.
			if text and os.remove(path) then
				local req = minetest.parse_json(text)
				if type(req) == "table" then
					req.id = id
					handle(req)
				else
					minetest.log("warning", "[eventsite] request " .. id .. " is not JSON; dropped")
				end
			end
		end
	end
end

local function work_jobs()
	local now = minetest.get_us_time()
	for i = #jobs, 1, -1 do
		local job = jobs[i]
		local body, remember = run(job.req, job.poll)
		if body == nil and now >= job.req.answer_by then
			body, remember = run(job.req, job.give_up)
		end
		if body ~= nil then
			table.remove(jobs, i)
			finish(job.req, body, remember)
		end
	end
end

local function beat()
	local now = os.time()
	for key, m in pairs(memory) do
		if m["until"] < now then
			memory[key] = nil
		end
	end
	minetest.safe_file_write(HEARTBEAT, minetest.write_json({ boot_id = boot_id, time = now, jobs = #jobs }))
	lapse_due() -- every second, whether or not the core calls
end

local since_beat = HEARTBEAT_S
minetest.register_globalstep(function(dtime)
	take_requests()
	work_jobs()
	since_beat = since_beat + dtime
	if since_beat >= HEARTBEAT_S then
		since_beat = 0
		beat()
	end
end)

-- The forceloads this mod holds are transient, so they never outlive its record of them:
-- take them again at every start.
minetest.after(0, function()
	for ref, rec in pairs(state.forceloads) do
		if rec.held and not minetest.forceload_block(rec.pos, true) then
			minetest.log("error", "[eventsite] no forceload slot is free to hold " .. ref .. " again")
		end
	end
end)

minetest.register_on_shutdown(function()
	save_state()
	os.remove(HEARTBEAT) -- the module says "unavailable" at once
end)

minetest.log("action", "[eventsite] loaded, boot id " .. boot_id)
